"""Syntax tree → formula source text: the inverse of :mod:`memform.lang.parser`.

Why: a printer that re-parses to the same tree is the sharpest test of the grammar (every
node must have exactly one spelling the parser reads back), and it lets tools rewrite
formula files (normalize, generate variants) without string surgery. Comments and layout
are not kept: the output is canonical, one declaration per line, with only the parentheses
the grammar needs.
"""

from __future__ import annotations

from . import ast

# Binding strength of each expression form, loosest first; mirrors grammar/memform.lark.
_IF, _OR, _AND, _NOT, _CMP, _SUM, _PRODUCT, _UNARY, _ATOM = range(9)
_BINOP_LEVEL = {"+": _SUM, "-": _SUM, "*": _PRODUCT, "/": _PRODUCT, "%": _PRODUCT}


def print_file(tree: ast.File) -> str:
    """The source text of a whole file, one declaration per line (blocks span lines)."""
    return "".join(print_decl(d) + "\n" for d in tree.decls)


def print_decl(decl: ast.Decl) -> str:
    if isinstance(decl, ast.Include):
        return (f'include "{decl.path}"' + (f' if "{decl.when}"' if decl.when is not None else "")
                + (" after profile" if decl.after_profile else "")
                + (f" when {' or '.join(decl.keys)}" if decl.keys else ""))
    if isinstance(decl, ast.Binding):
        default = f" default {print_expr(decl.default)}" if decl.default is not None else ""
        unit = f" [{decl.unit}]" if decl.unit is not None else ""
        return (f"{decl.keyword} {decl.name} : {print_type(decl.type)} = {decl.path}{default} "
                f'"{decl.doc}"{unit}')
    if isinstance(decl, ast.Let):
        return f"let {decl.name} = {print_expr(decl.expr)}"
    if isinstance(decl, ast.Def):
        return f"def {decl.name}({', '.join(decl.params)}) = {print_expr(decl.expr)}"
    if isinstance(decl, ast.Require):
        return f'require {print_expr(decl.expr)} "{decl.message}"'
    if isinstance(decl, ast.Block):
        base = f" extends {decl.base}" if decl.base is not None else ""
        body = "".join(f"  {print_quantity(q)}\n" for q in decl.quantities)
        return f"{decl.kind} {decl.name}{base} {{\n{body}}}"
    if isinstance(decl, ast.Stack):
        return "stack {\n" + "".join(f"  {print_stack_entry(e)}\n" for e in decl.entries) + "}"
    raise TypeError(f"cannot print declaration {type(decl).__name__}")


def print_type(t: ast.TypeSpec) -> str:
    if t.kind == "enum":
        return "{" + ", ".join(f'"{c}"' for c in t.choices) + "}"
    if t.kind == "set":
        return "set {" + ", ".join(f'"{c}"' for c in t.choices) + "}"
    if t.kind == "names":
        return "list {" + ", ".join(f'"{c}"' for c in t.choices) + "}"
    if t.or_bool:
        return "bool | " + (f"int[{t.lo}..{t.hi}]" if t.lo is not None else "int")
    if t.or_list:
        return (f"int[{t.lo}..{t.hi}]" if t.lo is not None else "int") + " | list"
    if t.kind == "int" and t.lo is not None:
        return f"int[{t.lo}..{t.hi}]"
    return t.kind


def print_quantity(q: ast.Quantity) -> str:
    if getattr(q, "moment", False):
        return f"moment {q.name} = {print_expr(q.expr)}"
    variants = f"[{', '.join(q.variants)}]" if q.variants is not None else ""
    return f"{q.name}{variants} = {print_expr(q.expr)}"


def print_stack_entry(e: ast.StackEntry) -> str:
    place = f"{e.place} " if e.place is not None else ""
    count = f" * {_wrap(e.count, _ATOM)}" if e.count is not None else ""
    choice = ""
    if e.cond is not None:
        # block if c1 else b1 if c2 else other: each block after an `else` is tried under the next condition
        conds = [e.cond] + [c for c, _ in e.branches]
        blocks = [b for _, b in e.branches] + [e.other]
        choice = "".join(f" if {_wrap(c, _OR)} else {b}" for c, b in zip(conds, blocks))
    bindings = (" where " + ", ".join(f"{n} = {print_expr(x)}" for n, x in e.bindings)) if e.bindings else ""
    return f"{place}{e.block}{count}{choice}{bindings}"


def print_expr(node: ast.Expr) -> str:
    """``node`` as text, parenthesized only where the grammar needs it."""
    return _text(node)


def _is_where(node: ast.Expr) -> bool:
    where = getattr(ast, "Where", None)
    return where is not None and isinstance(node, where)


def _level(node: ast.Expr) -> int:
    if isinstance(node, ast.If) or _is_where(node):
        return _IF
    if isinstance(node, ast.Logic):
        return _OR if node.op == "or" else _AND
    if isinstance(node, ast.Not):
        return _NOT
    if isinstance(node, ast.Cmp):
        return _CMP
    if isinstance(node, ast.BinOp):
        return _UNARY if node.op == "^" else _BINOP_LEVEL[node.op]
    if isinstance(node, ast.Neg):
        return _UNARY
    return _ATOM


def _wrap(node: ast.Expr, need: int) -> str:
    """``node`` as text, in parentheses when it binds looser than the position needs."""
    text = _text(node)
    return text if _level(node) >= need else f"({text})"


def _text(node: ast.Expr) -> str:
    if isinstance(node, ast.Num):
        return node.text
    if isinstance(node, ast.Str):
        return f'"{node.value}"'
    if isinstance(node, ast.Bool):
        return "true" if node.value else "false"
    if isinstance(node, ast.Ref):
        attr = f".{node.attr}" if node.attr is not None else ""
        variant = f"[{node.variant}]" if node.variant is not None else ""
        return f"{node.name}{attr}{variant}"
    if isinstance(node, ast.Call):
        names = node.names or (None,) * len(node.args)
        return f"{node.func}({', '.join((f'{n}: ' if n else '') + _text(a) for n, a in zip(names, node.args))})"
    if isinstance(node, ast.If):
        return f"if {_text(node.cond)} then {_text(node.then)} else {_text(node.other)}"
    if isinstance(node, ast.Logic):
        inner = _AND if node.op == "or" else _NOT
        return f" {node.op} ".join(_wrap(o, inner) for o in node.operands)
    if isinstance(node, ast.Not):
        return f"not {_wrap(node.operand, _NOT)}"
    if isinstance(node, ast.Cmp):
        return f"{_wrap(node.left, _SUM)} {node.op} {_wrap(node.right, _SUM)}"
    if isinstance(node, ast.Neg):
        return f"-{_wrap(node.operand, _UNARY)}"
    if isinstance(node, ast.BinOp):
        if node.op == "^":  # power: atom "^" unary
            return f"{_wrap(node.left, _ATOM)} ^ {_wrap(node.right, _UNARY)}"
        level = _BINOP_LEVEL[node.op]  # left-associative: the right operand binds one level tighter
        return f"{_wrap(node.left, level)} {node.op} {_wrap(node.right, level + 1)}"
    if _is_where(node):  # expr-level and chainable: `x where a = 1 where b = 2`
        head = _text(node.expr) if _is_where(node.expr) else _wrap(node.expr, _OR)
        return head + "".join(f" where {name} = {_wrap(e, _OR)}" for name, e in node.bindings)
    raise TypeError(f"cannot print expression {type(node).__name__}")
