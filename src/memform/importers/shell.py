"""Read a bash launch script without running it: the variables it sets and the commands it would run.

Megatron-LM's launch scripts (``examples/gpt3/train_gpt3_175b_distributed.sh`` and its siblings)
keep the arguments in bash arrays, values in variables (``--num-layers $NUM_LAYERS``,
``${MASTER_PORT:-6000}``, ``$(($GPUS_PER_NODE*$NUM_NODES))``, ``$1``) and run ``torchrun ...
pretrain_gpt.py "${GPT_ARGS[@]}"`` at the end. :func:`run_script` follows such a script the way
bash would expand it, but never executes anything: commands are only recorded, ``$(...)`` is never
run, and ``$((...))`` is evaluated by a small integer-only evaluator over Python's ``ast``.

The parse is :mod:`bashlex`'s (statements, ``if``/``for``/functions, words, comments, line
continuations, positions). bashlex does not parse bash arrays (``A=( ... )``, ``A+=( ... )``),
``[[ ... ]]`` or ``$((...))``, so :func:`_mask` first blanks those constructs out *in place*
(same length, same lines) and remembers them; every word is then expanded from the original
text at bashlex's position, so quoting and line numbers are exact.

bashlex does not parse ``case`` either, nor quotes nested in a quoted command substitution
(``"$( cd "$( dirname "$0" )" && pwd )"``): the mask blanks each ``case ... esac`` into a ``:``
command and keeps its arms' offsets (an arm's body is parsed on its own, everything else blanked),
and blanks the inside of every ``$(...)``. ``while``/``until`` loops are followed while their
condition is known (an argument loop ``while [[ $# -gt 0 ]]; do case $1 in ...`` runs over the
arguments a :class:`Shell` is given; without them ``$#`` is unknown and the loop is not run).

What is not known without running the script (an environment variable the script does not set,
``$1`` without a default, ``$(cmd)``) stays in the expanded word as a :class:`Ref`; conditions
that depend on one are decided as bash would in a clean environment (unset = empty), with a
warning naming the variable.
"""

from __future__ import annotations

import ast as pyast
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import bashlex

from ..errors import MemformError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
#: builtins whose NAME=value arguments are assignments
DECLARE = {"export", "declare", "typeset", "local", "readonly"}
#: the longest a ``for`` loop is followed (a launch script's loops are short lists)
MAX_LOOP = 1000
#: commands that start a Python training script (what makes an `if` branch worth following)
LAUNCHERS = {"torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "torch.distributed.run"}
MAX_DEPTH = 32


@dataclass(frozen=True)
class Ref:
    """Something a word needs that the script does not give: ``$NAME`` (environment), ``$1``, ``$(...)``."""

    name: str
    kind: str   # "environment", "positional", "command", "unsupported"
    file: str
    line: int

    def describe(self) -> str:
        if self.kind == "positional":
            return f"${self.name} (a positional argument of the script, with no default)"
        if self.kind == "command":
            return f"{self.name} (a command substitution, which memform does not run)"
        if self.kind == "unsupported":
            return f"{self.name} (an expansion memform does not evaluate)"
        return f"${self.name} (not set in the script: an environment variable?)"


@dataclass(frozen=True)
class Word:
    """One expanded word (a field, after splitting): its text, and what it needs if not known."""

    text: str
    line: int
    refs: tuple[Ref, ...] = ()
    #: (text, refs) pieces, kept so that a stored value splits like bash later (known parts only)
    parts: tuple[tuple[str, tuple[Ref, ...]], ...] = ()

    @property
    def known(self) -> bool:
        return not self.refs

    def pieces(self) -> tuple[tuple[str, tuple[Ref, ...]], ...]:
        return self.parts or ((self.text, self.refs),)


@dataclass
class Command:
    """A simple command the script would run, with its words expanded."""

    words: list[Word]
    line: int


@dataclass
class Script:
    """What :func:`run_script` found: the commands in the order they would run, and warnings."""

    commands: list[Command] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


# ---- values --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Seg:
    """A piece of a word during expansion: quoted pieces are not split; ``brk`` starts a new field."""

    text: str
    quoted: bool
    refs: tuple[Ref, ...] = ()
    brk: bool = False
    line: int = 0   # where a stored value was written (0: here)


class Shell:
    """Variables (scalars are :class:`Word`, arrays lists of them) shared by the files of one import.

    ``positional``: the script's own arguments (``memform import megatron --args "a b c"``): ``$1``..,
    ``$#``, ``$@`` and ``shift`` then follow them; None (the default) leaves ``$1`` without a default
    unknown, as memform cannot know what the script would be given."""

    def __init__(self, positional: list[str] | None = None) -> None:
        self.vars: dict[str, Word | list[Word]] = {}
        self.functions: dict[str, object] = {}
        self.positional: list[str] | None = None
        if positional is not None:
            self.set_positional(list(positional))

    def set_positional(self, args: list[str]) -> None:
        for name in [n for n in self.vars if n.isdigit() and n != "0"]:
            del self.vars[name]
        self.positional = args
        for k, arg in enumerate(args, 1):
            self.vars[str(k)] = Word(arg, 0)
        self.vars["#"] = Word(str(len(args)), 0)

    def run(self, path: Path, text: str, script: Script | None = None) -> Script:
        """Follow ``text`` (the file ``path``) and return the commands it would run."""
        script = script if script is not None else Script()
        _Runner(self, path, text, script).run()
        return script


def run_script(path: Path, text: str, shell: Shell | None = None) -> Script:
    """Follow one script in a fresh (or the given) :class:`Shell`."""
    return (shell or Shell()).run(path, text)


# ---- masking what bashlex cannot parse -----------------------------------------------------------

@dataclass
class _Array:
    name: str
    append: bool
    start: int      # offset of NAME
    open: int       # offset of "("
    close: int      # offset of ")"


def _skip_quoted(text: str, i: int) -> int:
    """``text[i]`` opens a quote; the offset just past its closing quote (or the end)."""
    q = text[i]
    j = i + 1
    while j < len(text):
        c = text[j]
        if q == '"' and c == "\\":
            j += 2
            continue
        if c == q:
            return j + 1
        if q == '"' and c == "$" and text.startswith("$(", j):
            j = _skip_dollar_paren(text, j)
            continue
        j += 1
    return len(text)


def _skip_dollar_paren(text: str, i: int) -> int:
    """``text[i:]`` starts ``$(`` or ``$((``; the offset past the matching ``)``."""
    depth = 0
    j = i + 1
    while j < len(text):
        c = text[j]
        if c in "'\"":
            j = _skip_quoted(text, j)
            continue
        if c == "\\":
            j += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def _mask_arithmetic(text: str, out: list[str], start: int, end: int) -> None:
    """Blank ``$((...))`` and the inside of ``$(...)`` within a double-quoted string ``text[start:end]``
    (bashlex fails on quotes nested in a quoted command substitution: ``"$( cd "$( dirname "$0" )" && pwd )"``)."""
    i = start
    while i < end:
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith("$((", i):
            stop = min(_skip_dollar_paren(text, i), end)
            _blank(out, i, stop)
            i = stop
            continue
        if text.startswith("$(", i):
            stop = min(_skip_dollar_paren(text, i), end)
            _blank(out, i + 2, stop - 1)
            i = stop
            continue
        i += 1


def _blank(out: list[str], start: int, stop: int, fill: str = "_") -> None:
    """Overwrite ``out[start:stop]`` (newlines kept, so lines stay where they were)."""
    for k in range(start, stop):
        if out[k] != "\n":
            out[k] = fill


@dataclass
class _Case:
    """A ``case WORD in PATTERN) BODY ;; ... esac`` block (bashlex does not parse ``case``): offsets of
    the subject word and of each arm's patterns and body in the file."""

    start: int
    end: int
    word: tuple[int, int]
    arms: list[tuple[list[tuple[int, int]], tuple[int, int]]]


_BOUNDARY = " \t\n;&|()"


def _at_word(text: str, i: int, word: str) -> bool:
    """``text[i:]`` starts the reserved word ``word``, standing alone."""
    end = i + len(word)
    return text.startswith(word, i) and (i == 0 or text[i - 1] in _BOUNDARY) and \
        (end >= len(text) or text[end] in _BOUNDARY)


def _skip_construct(text: str, i: int) -> int:
    """Past a quoted string, ``$(...)``, ``${...}`` or backquotes starting at ``text[i]`` (else ``i + 1``)."""
    c = text[i]
    if c in "'\"":
        return _skip_quoted(text, i)
    if c == "\\":
        return i + 2
    if text.startswith("$(", i):
        return _skip_dollar_paren(text, i)
    if text.startswith("${", i):
        return _matching_brace(text, i + 1)
    if c == "`":
        j = text.find("`", i + 1)
        return len(text) if j < 0 else j + 1
    return i + 1


def _scan_case(text: str, i: int) -> _Case:
    """The ``case`` block whose reserved word starts at ``text[i]``."""
    n = len(text)

    def space(j: int) -> int:
        while j < n:
            if text[j] in " \t\n;" or text.startswith("\\\n", j):
                j += 2 if text[j] == "\\" else 1
            elif text[j] == "#" and (j == 0 or text[j - 1] in _BOUNDARY):
                while j < n and text[j] != "\n":
                    j += 1
            else:
                return j
        return j

    j = space(i + 4)
    w0 = j
    while j < n and text[j] not in " \t\n;":
        j = _skip_construct(text, j)
    word = (w0, j)
    j = space(j)
    if not _at_word(text, j, "in"):
        raise _ParseError("`case` without `in`", i)
    j += 2
    arms: list[tuple[list[tuple[int, int]], tuple[int, int]]] = []
    while True:
        j = space(j)
        if j >= n:
            raise _ParseError("`case` is never closed with `esac`", i)
        if _at_word(text, j, "esac"):
            return _Case(i, j + 4, word, arms)
        if text[j] == "(":
            j += 1
        patterns: list[tuple[int, int]] = []
        p0 = j
        while j < n and text[j] != ")":
            if text[j] == "|":
                patterns.append((p0, j))
                p0 = j + 1
                j += 1
                continue
            j = _skip_construct(text, j)
        if j >= n:
            raise _ParseError("a `case` pattern is never closed with ')'", p0)
        patterns.append((p0, j))
        patterns = [(a + len(text[a:b]) - len(text[a:b].lstrip()), b - len(text[a:b]) + len(text[a:b].rstrip()))
                    for a, b in patterns]
        j += 1
        b0 = j
        while j < n:
            if text.startswith(";;", j) or text.startswith(";&", j):
                break
            if _at_word(text, j, "esac"):
                break
            if _at_word(text, j, "case"):
                j = _scan_case(text, j).end
                continue
            if text[j] == "#" and (j == 0 or text[j - 1] in _BOUNDARY):
                while j < n and text[j] != "\n":
                    j += 1
                continue
            j = _skip_construct(text, j)
        arms.append((patterns, (b0, j)))
        if text.startswith(";;&", j):
            j += 3
        elif text.startswith(";;", j) or text.startswith(";&", j):
            j += 2


def _mask(text: str, cases: list[_Case] | None = None) -> tuple[str, list[_Array]]:
    """Blank out arrays' parentheses, ``[[ ]]``, ``$((...))``, the inside of ``$(...)`` and whole
    ``case`` blocks (each becomes a ``:`` command, recorded in ``cases``), same length, newlines kept."""
    out = list(text)
    arrays: list[_Array] = []
    cases = cases if cases is not None else []
    i, n = 0, len(text)
    word_start = True
    in_double_bracket = False
    stack: list[tuple[str, bool, int, int]] = []  # open arrays (they do not nest, but be safe)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            word_start = False
            continue
        if c == "'":
            i = _skip_quoted(text, i)
            word_start = False
            continue
        if c == '"':
            end = _skip_quoted(text, i)
            _mask_arithmetic(text, out, i + 1, end)
            i = end
            word_start = False
            continue
        if c == "#" and word_start:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "$" and text.startswith("$((", i):
            end = _skip_dollar_paren(text, i)
            for k in range(i, end):
                if out[k] != "\n":
                    out[k] = "_"
            i = end
            word_start = False
            continue
        if c == "$" and text.startswith("$(", i):
            end = _skip_dollar_paren(text, i)
            _blank(out, i + 2, end - 1)
            i = end
            word_start = False
            continue
        if c == "`":
            j = text.find("`", i + 1)
            i = n if j < 0 else j + 1
            word_start = False
            continue
        if word_start and not in_double_bracket and _at_word(text, i, "case"):
            case = _scan_case(text, i)
            cases.append(case)
            _blank(out, i, case.end, " ")
            out[i] = ":"
            i = case.end
            word_start = False
            continue
        if word_start:
            m = ASSIGN.match(text, i)
            if m and text.startswith("(", m.end()):
                stack.append((m.group(1), bool(m.group(2)), i, m.end()))
                out[m.end()] = " "
                i = m.end() + 1
                word_start = True
                continue
            if text.startswith("[[", i) and (i + 2 >= n or text[i + 2].isspace()):
                out[i] = " "
                in_double_bracket = True
                i += 2
                continue
        if in_double_bracket:
            if text.startswith("]]", i) and (i + 2 >= n or text[i + 2] in " \t\n;&|)"):
                out[i + 1] = " "
                in_double_bracket = False
                i += 2
                word_start = False
                continue
            if text.startswith("&&", i):
                out[i:i + 2] = "-a"
                i += 2
                continue
            if text.startswith("||", i):
                out[i:i + 2] = "-o"
                i += 2
                continue
        if c == ")" and stack:
            name, append, start, open_ = stack.pop()
            out[i] = " "
            arrays.append(_Array(name, append, start, open_, i))
            i += 1
            word_start = False
            continue
        word_start = c in " \t\n;&|()"
        i += 1
    if stack:
        name, _, start, _ = stack[-1]
        raise _ParseError(f"the array {name}=( is never closed with ')'", start)
    return "".join(out), arrays


class ShellParseError(MemformError):
    """The file is not bash that memform can parse (a plain arguments file may still split with shlex)."""


class _ParseError(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, max(0, pos)) + 1


def parse_error(path: Path, text: str, exc: Exception) -> ShellParseError:
    """A bashlex (or masking) failure as a MemformError naming the file and line."""
    pos = getattr(exc, "pos", None)
    if not isinstance(pos, int):
        m = re.search(r"position (\d+)", str(exc))
        pos = int(m.group(1)) if m else None
    if pos is None:  # bashlex's NotImplementedError has no position: the first construct it lacks
        m = re.search(r"(?m)^[ \t]*(case|select|coproc|\(\()[\s(]", text)
        pos = m.start(1) if m else None
    where = f"{path}:{line_of(text, pos)}" if pos is not None else str(path)
    what = str(exc) or type(exc).__name__
    if isinstance(exc, NotImplementedError):
        what = f"bash construct not supported by the parser ({what})"
    return ShellParseError(f"{where}: cannot parse the script as bash: {what} (memform reads launch scripts "
                        f"without running them: variables, arrays, if/for, $((...)), ${{VAR:-default}})")


# ---- arithmetic ----------------------------------------------------------------------------------

_ARITH_OPS = {pyast.Add, pyast.Sub, pyast.Mult, pyast.Div, pyast.Mod, pyast.Pow, pyast.FloorDiv}


def _ternary(expr: str) -> str:
    """bash's ``c ? a : b`` (lowest precedence, right-associative) as Python's ``(a) if (c) else (b)``,
    and ``&&`` / ``||`` / ``!`` as ``and`` / ``or`` / ``not`` (bash arithmetic, "ARITHMETIC EVALUATION")."""
    expr = re.sub(r"!(?!=)", " not ", expr.replace("&&", " and ").replace("||", " or "))
    depth = 0
    for i, c in enumerate(expr):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "?" and depth == 0:
            nested = 0
            for j in range(i + 1, len(expr)):
                d = expr[j]
                if d == "(":
                    depth += 1
                elif d == ")":
                    depth -= 1
                elif d == "?" and depth == 0:
                    nested += 1
                elif d == ":" and depth == 0:
                    if nested:
                        nested -= 1
                        continue
                    return (f"({_ternary(expr[i + 1:j])}) if ({_ternary(expr[:i])}) "
                            f"else ({_ternary(expr[j + 1:])})")
            raise ValueError(f"'?' without ':' in {expr.strip()!r}")
    # a parenthesised ternary: rewrite inside each top-level group
    out, depth, start = [], 0, 0
    for i, c in enumerate(expr):
        if c == "(":
            if depth == 0:
                out.append(expr[start:i + 1])
                start = i + 1
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(_ternary(expr[start:i]) if "?" in expr[start:i] else expr[start:i])
                start = i
    out.append(expr[start:])
    return "".join(out)


_COMPARE = {pyast.Lt: int.__lt__, pyast.LtE: int.__le__, pyast.Gt: int.__gt__, pyast.GtE: int.__ge__,
            pyast.Eq: int.__eq__, pyast.NotEq: int.__ne__}


def arithmetic(expr: str) -> int:
    """Evaluate bash integer arithmetic on literals: + - * / % ** and parentheses (``/`` truncates
    toward zero and ``%`` keeps the dividend's sign, as in bash), comparisons (1 or 0), ``&&`` ``||``
    ``!`` and ``c ? a : b`` (Pai-Megatron-Patch: ``$(( ($TP > 1) ? 1 : 0 ))``); ValueError on anything else."""
    try:
        tree = pyast.parse(_ternary(expr.strip()).strip() or "0", mode="eval")
    except SyntaxError:
        raise ValueError(f"not an integer expression: {expr.strip()!r}") from None

    def ev(node: pyast.AST) -> int:
        if isinstance(node, pyast.Expression):
            return ev(node.body)
        if isinstance(node, pyast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, pyast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            left, result = ev(node.left), True
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node)
                result = result and _COMPARE[type(op)](left, right)
                left = right
            return int(result)
        if isinstance(node, pyast.BoolOp):
            values = [ev(v) for v in node.values]
            return int(all(values) if isinstance(node.op, pyast.And) else any(values))
        if isinstance(node, pyast.UnaryOp) and isinstance(node.op, pyast.Not):
            return int(not ev(node.operand))
        if isinstance(node, pyast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, pyast.UnaryOp) and isinstance(node.op, (pyast.USub, pyast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, pyast.USub) else v
        if isinstance(node, pyast.BinOp) and type(node.op) in _ARITH_OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, pyast.Add):
                return a + b
            if isinstance(node.op, pyast.Sub):
                return a - b
            if isinstance(node.op, pyast.Mult):
                return a * b
            if isinstance(node.op, pyast.Pow):
                if b < 0 or b > 256:
                    raise ValueError(f"exponent {b} out of range")
                return a ** b
            if b == 0:
                raise ValueError("division by zero")
            if isinstance(node.op, pyast.FloorDiv):
                return a // b
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return q if isinstance(node.op, pyast.Div) else a - q * b
        raise ValueError(f"not an integer expression: {expr.strip()!r}")

    return ev(tree)


def list_expression(expr: str) -> list[int]:
    """A Python list expression of integers as Megatron-LM's ``--moe-layer-freq`` takes it
    (``([0]*3+[1]*58)``, ``[1,0,1]``, ``([1]*3+[0])*2``): list literals of integers, ``+`` of lists,
    ``*`` by an integer, parentheses. Evaluated safely (no ``eval``); ValueError otherwise."""
    try:
        tree = pyast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not a list expression: {expr.strip()!r}") from None

    def ev(node: pyast.AST) -> int | list[int]:
        if isinstance(node, pyast.Expression):
            return ev(node.body)
        if isinstance(node, pyast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, pyast.List):
            items = [ev(e) for e in node.elts]
            if not all(isinstance(x, int) for x in items):
                raise ValueError("lists must hold integers")
            return items  # type: ignore[return-value]
        if isinstance(node, pyast.BinOp) and isinstance(node.op, (pyast.Add, pyast.Mult)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, pyast.Add) and type(a) is type(b):
                return a + b  # type: ignore[operator]
            if isinstance(node.op, pyast.Mult):
                if isinstance(a, list) and isinstance(b, int) or isinstance(a, int) and isinstance(b, list):
                    count = b if isinstance(b, int) else a
                    if count > 1_000_000:
                        raise ValueError("list too long")
                    return a * b  # type: ignore[operator]
                if isinstance(a, int) and isinstance(b, int):
                    return a * b
        raise ValueError(f"not a list expression: {expr.strip()!r}")

    value = ev(tree)
    if not isinstance(value, list):
        raise ValueError(f"not a list expression: {expr.strip()!r}")
    return value


# ---- the runner ----------------------------------------------------------------------------------

class _Break(Exception):
    """``break`` in a followed loop."""


class _Continue(Exception):
    """``continue`` in a followed loop."""


class _Runner:
    def __init__(self, shell: Shell, path: Path, text: str, script: Script, depth: int = 0):
        self.shell = shell
        self.path = path
        self.file = str(path)
        self.text = text
        self.script = script
        self.depth = depth
        self.cases: dict[int, _Case] = {}
        self.arrays: dict[int, _Array] = {}

    # -- entry --
    def run(self, region: tuple[int, int] | None = None) -> None:
        """Follow the file, or only ``text[region]`` (a ``case`` arm's body: everything else is blanked,
        so that offsets and lines stay the file's)."""
        text = self.text
        if region is not None:
            a, b = region
            text = "".join(c if c == "\n" else " " for c in text[:a]) + text[a:b] + \
                "".join(c if c == "\n" else " " for c in text[b:])
        cases: list[_Case] = []
        try:
            masked, arrays = _mask(text, cases)
            if not masked.strip():
                return
            nodes = bashlex.parse(masked)
        except MemformError:
            raise
        except Exception as exc:  # bashlex raises its own ParsingError, NotImplementedError, ...
            raise parse_error(self.path, self.text, exc) from None
        self.cases = {c.start: c for c in cases}
        self.arrays = {a.start: a for a in arrays}
        self.elements: dict[int, list] = {a.start: [] for a in arrays}
        for node in nodes:
            self._collect_elements(node)
        for node in nodes:
            self.walk(node)

    def line(self, pos: int) -> int:
        return line_of(self.text, pos)

    def _inside_array(self, pos: int) -> _Array | None:
        for a in self.arrays.values():
            if a.open < pos < a.close:
                return a
        return None

    def _collect_elements(self, node) -> None:
        """Each array's elements: the words bashlex found between its parentheses."""
        kind = getattr(node, "kind", "")
        if kind == "command":
            for part in node.parts:
                if part.kind in ("word", "assignment"):
                    a = self._inside_array(part.pos[0])
                    if a is not None:
                        self.elements[a.start].append(part)
            return
        for child in _children(node):
            self._collect_elements(child)

    # -- statements --
    def walk(self, node) -> bool | None:
        """Follow one node; its exit status where it can be known (True = success)."""
        kind = node.kind
        if kind == "command":
            return self.command(node)
        if kind == "list":
            return self.list_(node.parts)
        if kind == "compound":
            return self.list_([p for p in node.list if p.kind not in ("reservedword",)])
        if kind == "pipeline":
            negate = any(p.kind == "reservedword" and p.word == "!" for p in node.parts)
            status = None
            for p in node.parts:
                if p.kind not in ("reservedword", "pipe"):
                    status = self.walk(p)
            return (not status if status is not None else None) if negate else status
        if kind == "if":
            return self.if_(node)
        if kind == "for":
            return self.for_(node)
        if kind == "function":
            name = node.parts[0].word
            self.shell.functions[name] = (self, node.parts[-1])
            return True
        if kind in ("while", "until"):
            return self.while_(node, until=kind == "until")
        if kind in ("operator", "reservedword", "pipe", "commandsubstitution", "processsubstitution"):
            return None
        return None

    def list_(self, parts: list) -> bool | None:
        status: bool | None = True
        skip = False
        for p in parts:
            if p.kind == "operator":
                if p.op == "&&":
                    skip = status is False
                elif p.op == "||":
                    skip = status is True
                else:
                    skip = False
                continue
            if skip:
                continue
            result = self.walk(p)
            status = True if result is None else result
        return status

    def relevant(self, node) -> bool:
        """Whether following ``node`` can change what the import sees (assignments, commands that run
        Python, ``case`` blocks, ``shift``)."""
        found = False

        def visit(n) -> None:
            nonlocal found
            if found:
                return
            if n.kind == "assignment" or n.kind == "command" and n.pos[0] in self.cases:
                found = True
                return
            if n.kind == "command":
                words = [p for p in n.parts if p.kind == "word"]
                if words and (words[0].word in DECLARE | {"unset", "source", ".", "shift"} | LAUNCHERS
                              or words[0].word in self.shell.functions):
                    found = True
                    return
                if any(re.search(r"\.py\W*$", self.text[w.pos[0]:w.pos[1]]) for w in words) or \
                        words and "$" in self.text[words[0].pos[0]:words[0].pos[1]]:
                    found = True
                    return
            for c in _children(n):
                visit(c)

        visit(node)
        return found

    def if_(self, node) -> bool | None:
        clauses: list[tuple[object | None, list]] = []
        cond = None
        body: list = []
        mode = ""

        def flat(parts: list, shift: int = 0) -> list:
            # bashlex nests the third and later `elif` clauses in a reservedword node whose word is the list
            # of their nodes (elif, condition, then, body, the next such node), with positions short by the
            # outermost such node's own position (bashlex 0.18): put them where they are in the file
            out = []
            for q in parts:
                if q.kind == "reservedword" and isinstance(q.word, list):
                    out.extend(flat(q.word, shift + q.pos[0]))
                else:
                    if shift:
                        _shift(q, shift)
                    out.append(q)
            return out

        for p in flat(node.parts):
            if p.kind == "reservedword" and p.word in ("if", "elif", "else", "then", "fi"):
                if p.word in ("elif", "else", "fi") and mode == "then":
                    clauses.append((cond, body))
                    cond, body = None, []
                if p.word == "else":
                    mode, cond = "else", None
                elif p.word == "then":
                    mode = "then"
                elif p.word in ("if", "elif"):
                    mode = "cond"
                elif p.word == "fi" and mode == "else":
                    clauses.append((None, body))
                continue
            if mode == "cond":
                cond = p
            else:
                body.append(p)
        if not any(self.relevant(b) for _, bs in clauses for b in bs):
            return None
        for cond, body in clauses:
            if cond is not None:
                taken, why = self.condition(cond)
                if why:
                    self.script.warn(f"{self.file}:{self.line(cond.pos[0])}: the `if` condition depends on "
                                     f"what memform cannot know: {why}; the condition is taken as "
                                     f"{'true' if taken else 'false'}")
                if not taken:
                    continue
            status = True
            for b in body:
                status = self.walk(b)
            return status
        return None

    def while_(self, node, *, until: bool) -> bool | None:
        """``while COND; do BODY; done`` (and ``until``): followed while the condition is known to hold,
        at most MAX_LOOP times -- an argument loop ``while [[ $# -gt 0 ]]; do case $1 in ...; esac; done``
        runs over the arguments given with ``--args`` (none: ``$#`` is unknown, and the loop is not run)."""
        cond: list = []
        body: list = []
        mode = ""
        for p in node.parts:
            if p.kind == "reservedword" and p.word in ("while", "until", "do", "done"):
                mode = {"while": "cond", "until": "cond", "do": "body", "done": ""}[p.word]
                continue
            (cond if mode == "cond" else body if mode == "body" else []).append(p)
        if not any(self.relevant(b) for b in body) or not cond:
            return None
        kind = "until" if until else "while"
        for _ in range(MAX_LOOP):
            taken, why = self.condition(cond[-1]) if len(cond) == 1 else (None, "")
            if taken is None:
                for c in cond[:-1]:
                    self.walk(c)
                taken, why = self.condition(cond[-1])
            if why:
                self.script.warn(f"{self.file}:{self.line(node.pos[0])}: the `{kind}` condition depends on what "
                                 f"memform cannot know: {why}; the loop stops there")
                return None
            if taken == until:
                return True
            try:
                for b in body:
                    try:
                        self.walk(b)
                    except _Continue:
                        break
            except _Break:
                return True
        self.script.warn(f"{self.file}:{self.line(node.pos[0])}: the `{kind}` loop was followed {MAX_LOOP} "
                         f"times and left there")
        return None

    def case_(self, case: _Case) -> bool | None:
        """``case WORD in PATTERN|PATTERN) BODY ;; ... esac``: the first arm whose glob pattern matches
        the known word runs (bash's "Compound Commands"); an unknown word runs no arm, with a warning."""
        a, b = case.word
        subject = _join(self.segments(self.text[a:b], a, quoted=True), self.line(a))
        if not subject.known:
            self.script.warn(f"{self.file}:{self.line(case.start)}: `case {self.text[a:b]}` depends on "
                             f"{subject.refs[0].describe()}; no branch of it is followed")
            return None
        for patterns, (b0, b1) in case.arms:
            for p0, p1 in patterns:
                segs = self.segments(self.text[p0:p1], p0, quoted=True)
                if any(seg.refs for seg in segs):
                    continue
                # quoted pieces match literally, the rest as a glob
                glob = "".join(seg.text if not seg.quoted or not _has_quote(self.text[p0:p1])
                               else _glob_escape(seg.text) for seg in segs)
                if fnmatch.fnmatchcase(subject.text, glob):
                    runner = _Runner(self.shell, self.path, self.text, self.script, self.depth + 1)
                    if self.depth < MAX_DEPTH:
                        runner.run((b0, b1))
                    return True
        return True

    def for_(self, node) -> bool | None:
        parts = node.parts
        if len(parts) < 2 or parts[1].kind != "word":
            return None
        var = parts[1].word
        items: list[Word] = []
        body = []
        mode = ""
        for p in parts[2:]:
            if p.kind == "reservedword":
                if p.word == "in":
                    mode = "in"
                elif p.word == "do":
                    mode = "do"
                elif p.word in (";", "done"):
                    if mode == "in":
                        mode = "after"
                continue
            if mode == "in" and p.kind == "word":
                items.extend(self.expand(p))
            elif mode == "do":
                body.append(p)
        if not any(self.relevant(b) for b in body):
            return None
        if any(not w.known for w in items):
            self.script.warn(f"{self.file}:{self.line(node.pos[0])}: the `for` loop's list is not known; "
                             f"the loop is not followed")
            return None
        for w in items[:MAX_LOOP]:
            self.shell.vars[var] = w
            for b in body:
                self.walk(b)
        return True

    # -- conditions --
    def condition(self, node) -> tuple[bool, str]:
        """A condition's truth, and what it assumed ('' when it assumed nothing)."""
        assumed: list[str] = []
        value = self._cond(node, assumed)
        return bool(value), ", ".join(dict.fromkeys(assumed))

    def _cond(self, node, assumed: list[str]) -> bool:
        kind = node.kind
        if kind == "list":
            status = True
            skip = False
            for p in node.parts:
                if p.kind == "operator":
                    skip = (p.op == "&&" and not status) or (p.op == "||" and status)
                    continue
                if not skip:
                    status = self._cond(p, assumed)
            return status
        if kind == "pipeline":
            negate = any(p.kind == "reservedword" and p.word == "!" for p in node.parts)
            inner = [p for p in node.parts if p.kind not in ("reservedword", "pipe")]
            value = self._cond(inner[-1], assumed) if inner else True
            return not value if negate else value
        if kind == "compound":
            inner = [p for p in node.list if p.kind != "reservedword"]
            return self._cond(inner[-1], assumed) if inner else True
        if kind != "command":
            assumed.append(f"a `{kind}` construct (not evaluated), taken as false")
            return False
        words: list[Word] = []
        for part in node.parts:
            if part.kind == "word":
                words.extend(self.expand(part))
        texts = []
        for w in words:
            for r in w.refs:
                assumed.append(f"{r.describe()}, taken as unset")
            texts.append(w.text if w.known else "")
        if not texts:
            return True
        head, args = texts[0], texts[1:]
        if head in ("true", ":"):
            return True
        if head == "false":
            return False
        if head == "[":
            if args and args[-1] == "]":
                args = args[:-1]
            return self._test(args, assumed)
        if head == "test":
            return self._test(args, assumed)
        assumed.append(f"the command `{head}` (not run), taken as failing")
        return False

    def _test(self, args: list[str], assumed: list[str]) -> bool:
        """``test`` / ``[ ]`` / ``[[ ]]`` on known strings (``-a`` / ``-o`` / ``!`` included)."""
        for op in ("-o", "-a"):
            if op in args:
                i = args.index(op)
                left, right = self._test(args[:i], assumed), self._test(args[i + 1:], assumed)
                return (left or right) if op == "-o" else (left and right)
        if args and args[0] == "!":
            return not self._test(args[1:], assumed)
        if not args:
            return False
        if len(args) == 1:
            return args[0] != ""
        if len(args) == 2:
            op, s = args
            if op == "-n":
                return s != ""
            if op == "-z":
                return s == ""
            assumed.append(f"the file test `{op} {s}`, taken as false")
            return False
        if len(args) == 3:
            a, op, b = args
            if op in ("=", "=="):
                return a == b
            if op == "!=":
                return a != b
            ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                    "-gt": int.__gt__, "-ge": int.__ge__}
            if op in ints:
                try:
                    return ints[op](int(a or 0), int(b or 0))
                except ValueError:
                    pass
        assumed.append(f"the test `{' '.join(args)}` (not evaluated), taken as false")
        return False

    # -- commands --
    def command(self, node) -> bool | None:
        if self._inside_array(node.pos[0]) is not None:
            return True  # array elements, read with their array
        if node.pos[0] in self.cases:
            return self.case_(self.cases[node.pos[0]])
        assigns = []
        words = []
        for part in node.parts:
            if part.kind == "assignment" and not words:
                assigns.append(part)
            elif part.kind in ("word", "assignment"):
                if self._inside_array(part.pos[0]) is None:
                    words.append(part)
        if not words:
            for a in assigns:
                self.assign(a)
            return True
        fields: list[Word] = []
        for w in words:
            fields.extend(self.expand(w))
        if not fields:
            return True
        head = fields[0].text if fields[0].known else ""
        line = self.line(node.pos[0])
        if head in ("[", "test", "true", "false", ":"):
            # `[ -z "$X" ] && X=1`: decided like an `if` (unknowns unset), silently, as ${X:-1} is
            return self.condition(node)[0]
        if head in DECLARE:
            for w in words[1:]:
                raw = self.text[w.pos[0]:w.pos[1]]
                if w.pos[0] in self.arrays or ASSIGN.match(raw):
                    self.assign(w)
            return True
        if head == "unset":
            for f in fields[1:]:
                if f.known and not f.text.startswith("-"):
                    self.shell.vars.pop(f.text, None)
            return True
        if head == "shift":
            if self.shell.positional is not None:
                count = int(fields[1].text) if len(fields) > 1 and fields[1].known and \
                    fields[1].text.isdigit() else 1
                self.shell.set_positional(self.shell.positional[count:])
            return True
        if head == "eval" and len(fields) > 1 and self.depth < MAX_DEPTH:
            # eval ${run_cmd} (Pai-Megatron-Patch's run scripts): the words joined by spaces, read as bash
            # again (quotes inside the value now count), on the eval's own line
            text = "\n" * (line - 1) + " ".join(w.text for w in fields[1:])
            before = len(self.script.commands)
            try:
                _Runner(self.shell, self.path, text, self.script, self.depth + 1).run()
                return None
            except ShellParseError:
                del self.script.commands[before:]
                self.script.warn(f"{self.file}:{line}: the words `eval` runs do not parse as bash; taken as "
                                 f"one command")
        if head == "break":
            raise _Break()
        if head == "continue":
            raise _Continue()
        if head in ("source", "."):
            target = fields[1].text if len(fields) > 1 and fields[1].known else "?"
            self.script.warn(f"{self.file}:{line}: `{head} {target}` is not followed; name that file before "
                             f"this one on the command line to read its variables")
            return True
        if head in self.shell.functions:
            runner, body = self.shell.functions[head]
            if self.depth < MAX_DEPTH:
                self.depth += 1
                try:
                    runner.walk(body)
                finally:
                    self.depth -= 1
            return True
        self.script.commands.append(Command(fields, line))
        return None

    def assign(self, node) -> None:
        """``NAME=value``, ``NAME+=value``, ``NAME=( ... )``, ``NAME+=( ... )`` (value not split)."""
        start = node.pos[0]
        if start in self.arrays:
            a = self.arrays[start]
            items: list[Word] = []
            for element in self.elements[start]:
                items.extend(self.expand(element))
            old = self.shell.vars.get(a.name)
            if a.append and old is not None:
                base = old if isinstance(old, list) else [old]
                self.shell.vars[a.name] = base + items
            else:
                self.shell.vars[a.name] = items
            return
        raw = self.text[node.pos[0]:node.pos[1]]
        m = ASSIGN.match(raw)
        if not m:
            return
        name, append = m.group(1), bool(m.group(2))
        segs = self.segments(raw[m.end():], node.pos[0] + m.end(), quoted=True)
        value = _join(segs, self.line(start))
        old = self.shell.vars.get(name)
        if append and old is not None:
            base = old[0] if isinstance(old, list) and old else old
            if isinstance(base, Word):
                value = Word(base.text + value.text, value.line, base.refs + value.refs)
            if isinstance(old, list):
                self.shell.vars[name] = [value] + old[1:]
                return
        self.shell.vars[name] = value

    # -- words --
    def expand(self, node) -> list[Word]:
        """A bashlex word node → its fields (expansion, quote removal, splitting of unquoted expansions)."""
        raw = self.text[node.pos[0]:node.pos[1]]
        return _split(self.segments(raw, node.pos[0], quoted=False), self.line(node.pos[0]))

    def segments(self, raw: str, offset: int, quoted: bool) -> list[_Seg]:
        """``raw`` (at ``offset`` in the file) as segments; ``quoted``: the whole text is in double quotes
        or an assignment value (no splitting)."""
        segs: list[_Seg] = []
        i, n = 0, len(raw)
        lit = []

        def flush() -> None:
            if lit:
                segs.append(_Seg("".join(lit), True))
                lit.clear()

        while i < n:
            c = raw[i]
            if c == "\\":
                if i + 1 < n and raw[i + 1] == "\n":
                    i += 2
                    continue
                lit.append(raw[i + 1] if i + 1 < n else "")
                i += 2
                continue
            if c == "'":
                j = raw.find("'", i + 1)
                j = n if j < 0 else j
                lit.append(raw[i + 1:j])
                if j == i + 1:
                    segs.append(_Seg("", True))
                i = j + 1
                continue
            if c == "$" and raw.startswith("$'", i):
                j = raw.find("'", i + 2)
                j = n if j < 0 else j
                lit.append(raw[i + 2:j].encode().decode("unicode_escape", errors="replace"))
                i = j + 1
                continue
            if c == '"':
                j = _skip_quoted(raw, i)
                closed = j - 1 > i and raw[j - 1] == '"'
                inner = raw[i + 1:j - 1] if closed else raw[i + 1:j]
                flush()
                inside = self._double(inner, offset + i + 1)
                if not inside and not re.search(r"\[@\]|\$\{?@", inner):  # "${A[@]}", "$@": no word
                    inside = [_Seg("", True)]
                segs.extend(inside)
                i = j
                continue
            if c == "$" or c == "`":
                flush()
                new, i = self._dollar(raw, i, offset, quoted)
                segs.extend(new)
                continue
            lit.append(c)
            i += 1
        flush()
        return segs

    def _double(self, inner: str, offset: int) -> list[_Seg]:
        """The inside of "..." (escapes \\$ \\` \\" \\\\ and line continuations; expansions quoted)."""
        segs: list[_Seg] = []
        lit: list[str] = []
        i, n = 0, len(inner)
        while i < n:
            c = inner[i]
            if c == "\\" and i + 1 < n and inner[i + 1] in '$`"\\\n':
                if inner[i + 1] != "\n":
                    lit.append(inner[i + 1])
                i += 2
                continue
            if c in "$`":
                if lit:
                    segs.append(_Seg("".join(lit), True))
                    lit = []
                new, i = self._dollar(inner, i, offset, True)
                segs.extend(new)
                continue
            lit.append(c)
            i += 1
        if lit:
            segs.append(_Seg("".join(lit), True))
        return segs

    def _dollar(self, raw: str, i: int, offset: int, quoted: bool) -> tuple[list[_Seg], int]:
        """An expansion at ``raw[i]`` (``$``, or a backquote): its segments and the offset after it."""
        line = self.line(offset + i)
        if raw[i] == "`":
            j = raw.find("`", i + 1)
            j = len(raw) if j < 0 else j + 1
            ref = Ref(raw[i:j], "command", self.file, line)
            return [_Seg(raw[i:j], quoted, (ref,))], j
        if raw.startswith("$((", i):
            j = _skip_dollar_paren(raw, i)
            return [self._arith(raw[i + 3:j - 2], raw[i:j], line, quoted, offset + i + 3)], j
        if raw.startswith("$(", i):
            j = _skip_dollar_paren(raw, i)
            ref = Ref(raw[i:j], "command", self.file, line)
            return [_Seg(raw[i:j], quoted, (ref,))], j
        if raw.startswith("${", i):
            j = _matching_brace(raw, i + 1)
            return self._braced(raw[i + 2:j - 1], raw[i:j], offset + i + 2, line, quoted), j
        m = NAME.match(raw, i + 1)
        if m:
            return self._lookup(m.group(0), raw[i:m.end()], line, quoted), m.end()
        if i + 1 < len(raw) and raw[i + 1] in "0123456789@*#?$!-":
            return self._lookup(raw[i + 1], raw[i:i + 2], line, quoted), i + 2
        return [_Seg("$", True)], i + 1  # a lone dollar sign is literal

    def _lookup(self, name: str, source: str, line: int, quoted: bool, index: str | None = None) -> list[_Seg]:
        """``$name`` / ``${name[index]}``: the value's segments (unknown → a Ref)."""
        if name in ("@", "*"):
            args = self.shell.positional
            if args is None:
                self.script.warn(f"{self.file}:{line}: {source} (the script's own arguments) is taken as "
                                 f"empty: pass them with --args, or extra arguments in a file after the script")
                return []
            if quoted and name == "*":
                return [_Seg(" ".join(args), quoted)]
            return [_Seg(arg, quoted, brk=k > 0) for k, arg in enumerate(args)]
        if name.isdigit():
            if name == "0":
                return [_Seg(str(self.path), quoted)]
            value = self.shell.vars.get(name)
            if value is None:
                if self.shell.positional is not None:  # fewer arguments given: empty, as in bash
                    return [_Seg("", quoted)]
                return [_Seg(source, quoted, (Ref(name, "positional", self.file, line),))]
        elif name == "#" and self.shell.positional is not None:
            pass
        elif name in "#?$!-":
            return [_Seg(source, quoted, (Ref(source, "unsupported", self.file, line),))]
        value = self.shell.vars.get(name)
        if value is None:
            return [_Seg(source, quoted, (Ref(name, "environment", self.file, line),))]
        if isinstance(value, list):
            if index in ("@", "*"):
                if quoted and index == "*":
                    return [_join_seg(value, quoted)]
                return [seg for k, v in enumerate(value) for seg in _segs_of(v, quoted, brk=k > 0)]
            k = 0
            if index is not None:
                try:
                    k = arithmetic(index)
                except ValueError:
                    return [_Seg(source, quoted, (Ref(source, "unsupported", self.file, line),))]
            if -len(value) <= k < len(value):
                return _segs_of(value[k], quoted)
            return [_Seg("", quoted)]
        if index not in (None, "0", "@", "*"):
            return [_Seg("", quoted)]
        return _segs_of(value, quoted)

    def _braced(self, inner: str, source: str, offset: int, line: int, quoted: bool) -> list[_Seg]:
        """``${...}``: NAME, NAME[i], #NAME, #NAME[@], and the :- - := = :+ + :? ? operators."""
        m = re.fullmatch(r"#([A-Za-z_]\w*)(?:\[[@*]\])?", inner)
        if m:
            value = self.shell.vars.get(m.group(1))
            if value is None:
                return [_Seg(source, quoted, (Ref(m.group(1), "environment", self.file, line),))]
            if isinstance(value, list):
                count = len(value) if "[" in inner else len(value[0].text) if value else 0
                return [_Seg(str(count), quoted)]
            if not value.known:
                return [_Seg(source, quoted, value.refs)]
            return [_Seg(str(len(value.text)), quoted)]
        m = re.match(r"([A-Za-z_]\w*|\d+|[@*#?$!-])(?:\[([^\]]*)\])?", inner)
        if not m:
            return [_Seg(source, quoted, (Ref(source, "unsupported", self.file, line),))]
        name, index = m.group(1), m.group(2)
        rest = inner[m.end():]
        if not rest:
            return self._lookup(name, source, line, quoted, index)
        op = re.match(r":?[-=+?]", rest)
        if not op:
            return [_Seg(source, quoted, (Ref(source, "unsupported", self.file, line),))]
        word = rest[op.end():]
        colon, kind = op.group(0).startswith(":"), op.group(0)[-1]
        value = self.shell.vars.get(name)
        if isinstance(value, list):
            value = value[0] if value else Word("", line)
        if value is not None and not value.known:
            return _segs_of(value, quoted)
        is_set = value is not None and (value.text != "" or not colon)
        word_offset = offset + m.end() + op.end()
        if kind == "+":
            return self._word_segs(word, word_offset, quoted) if is_set else []
        if is_set:
            return [_Seg(value.text, quoted)]
        if kind == "?":
            return [_Seg(source, quoted, (Ref(name, "positional" if name.isdigit() else "environment",
                                              self.file, line),))]
        segs = self._word_segs(word, word_offset, quoted)
        if kind == "=":
            if name.isdigit():
                return [_Seg(source, quoted, (Ref(source, "unsupported", self.file, line),))]
            self.shell.vars[name] = _join(segs, line)
        return segs

    def _word_segs(self, word: str, offset: int, quoted: bool) -> list[_Seg]:
        segs = self.segments(word, offset, quoted)
        if quoted:
            segs = [_Seg(s.text, True, s.refs, s.brk) for s in segs]
        return segs

    def _arith(self, expr: str, source: str, line: int, quoted: bool, offset: int) -> _Seg:
        """``$((expr))``: variables (``$X``, ``${X}``, bare ``X``; unset = 0 as in bash) then integers."""
        segs = self.segments(expr, offset, True) if "$" in expr else [_Seg(expr, True)]
        refs = tuple(r for s in segs for r in s.refs)
        if refs:
            return _Seg(source, quoted, refs)
        text = "".join(s.text for s in segs)
        missing: list[Ref] = []

        def name(m: re.Match) -> str:
            value = self.shell.vars.get(m.group(0))
            if isinstance(value, list):
                value = value[0] if value else None
            if value is None:  # bash reads an unset name as 0, but the environment may set it
                missing.append(Ref(m.group(0), "environment", self.file, line))
                return "0"
            if not value.known:
                missing.extend(value.refs)
                return "0"
            return value.text.strip() or "0"

        text = re.sub(r"[A-Za-z_]\w*", name, text)
        if missing:
            return _Seg(source, quoted, tuple(missing))
        try:
            return _Seg(str(arithmetic(text)), quoted)
        except ValueError as exc:
            raise MemformError(f"{self.file}:{line}: cannot evaluate {source}: {exc}") from None


def _shift(node, by: int, seen: set[int] | None = None) -> None:
    """Move a bashlex node and everything inside it ``by`` characters (see :meth:`_Runner.if_`)."""
    seen = set() if seen is None else seen
    if id(node) in seen or not hasattr(node, "pos"):
        return
    seen.add(id(node))
    node.pos = (node.pos[0] + by, node.pos[1] + by)
    for attr in ("parts", "list"):
        for child in getattr(node, attr, None) or ():
            _shift(child, by, seen)
    for attr in ("command", "output"):
        child = getattr(node, attr, None)
        if child is not None and hasattr(child, "kind"):
            _shift(child, by, seen)
    word = getattr(node, "word", None)
    if isinstance(word, list):
        for child in word:
            _shift(child, by, seen)


def _has_quote(pattern: str) -> bool:
    return any(c in pattern for c in "'\"\\")


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _matching_brace(raw: str, i: int) -> int:
    """``raw[i]`` is ``{`` of ``${``; the offset past its ``}`` (quotes and nesting respected)."""
    depth = 0
    j = i
    while j < len(raw):
        c = raw[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"":
            j = _skip_quoted(raw, j)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(raw)


def _children(node) -> Iterable:
    for attr in ("parts", "list"):
        for child in getattr(node, attr, None) or ():
            yield child
    command = getattr(node, "command", None)
    if command is not None and hasattr(command, "kind"):
        yield command


def _join(segs: list[_Seg], line: int) -> Word:
    refs = tuple(r for s in segs for r in s.refs)
    return Word("".join(s.text for s in segs), line, refs, tuple((s.text, s.refs) for s in segs))


def _segs_of(value: Word, quoted: bool, brk: bool = False) -> list[_Seg]:
    """A stored value as segments again (each piece keeps what it needs, and the line it was written on)."""
    pieces = value.pieces()
    return [_Seg(t, quoted, r, brk=brk and k == 0, line=value.line) for k, (t, r) in enumerate(pieces)] or \
        [_Seg("", quoted, (), brk, value.line)]


def _join_seg(values: list[Word], quoted: bool) -> _Seg:
    return _Seg(" ".join(v.text for v in values), quoted, tuple(r for v in values for r in v.refs))


def _split(segs: list[_Seg], line: int) -> list[Word]:
    """Field splitting: unquoted known expansions split on whitespace; ``brk`` starts a new field."""
    fields: list[Word] = []
    parts: list[tuple[str, tuple[Ref, ...]]] = []
    exists = False
    at = 0  # the line a stored value in this field was written on

    def end() -> None:
        nonlocal exists, at
        if exists:
            refs = tuple(r for _, rs in parts for r in rs)
            fields.append(Word("".join(t for t, _ in parts), at or line, refs, tuple(parts)))
        parts.clear()
        exists = False
        at = 0

    for s in segs:
        if s.brk:
            end()
            exists = True
        if s.line and not at:
            at = s.line
        if s.quoted or s.refs:
            parts.append((s.text, s.refs))
            exists = True
            continue
        pieces = re.split(r"[ \t\n]+", s.text)
        for k, piece in enumerate(pieces):
            if k > 0:
                end()
            if piece:
                parts.append((piece, ()))
                exists = True
    end()
    return fields
