"""Memo sharing between the walks of structures that differ in a few config values.

A search or a what-if page evaluates one config under many structural choices (pipeline size,
recompute mode, ZeRO stage), each a walk of the same formula program. Most of what one walk computes
does not depend on the choice that changed: a layer's activations do not read the ZeRO stage.
This mixin for any :class:`memform.engine.walker.Walker` records, for every memoized quantity and
``let``, what its value read: the bindings (config values, kept symbols) and the stages' layer lists
that ``layers_*`` reductions visit. The next walk (``share(prior)``: the same program) takes a value
from the previous one where every such read is equal in both -- the value is then the one it would
compute -- and computes the rest. Nothing else differs between two walks of one program: the memo
keys carry the rest (block, mode, stage, the ``where`` replacements).
"""

from __future__ import annotations

from typing import Any

from ..engine.walker import Ctx


class SharedMemo:
    """Mixin (first base) of a walker backend; call :meth:`share` (None or the previous walk) before
    evaluating, after the stages' layer lists are set (``stage_layers``)."""

    prior: Any = None

    def share(self, prior: "SharedMemo | None") -> None:
        """Take values from ``prior`` (its own prior is dropped: one structure back)."""
        if not hasattr(self, "_deps"):
            self._stack: list[set] = []
            self._deps: dict[tuple, frozenset] = {}
            self._same: dict[tuple, bool] = {}
        if prior is not None and prior.program is self.program and self._compatible(prior):
            prior.prior = None
            self.prior = prior

    def quantity(self, block: str, qname: str, mode: str | None = None, loc: Any = None,
                 extra: tuple = (), overrides: tuple = ()) -> Any:
        return self._shared(("q", block, qname, mode, extra, overrides),
                            lambda: super(SharedMemo, self).quantity(block, qname, mode, loc, extra, overrides))

    def let(self, name: str, loc: Any = None, overrides: tuple = (), stage: Any = None) -> Any:
        return self._shared(("let", name, overrides) if stage is None else ("let", name, overrides, stage),
                            lambda: super(SharedMemo, self).let(name, loc, overrides, stage))

    def _shared(self, key: tuple, compute: Any) -> Any:
        if not hasattr(self, "_deps"):
            self.share(None)
        stack = self._stack
        if key in self._memo:
            if stack:
                stack[-1] |= self._deps.get(key, frozenset())
            return self._memo[key]
        p = self.prior
        if p is not None and key in p._memo:
            deps = p._deps.get(key)
            if deps is not None and all(self._equal(d) for d in deps):
                self._memo[key] = value = p._memo[key]
                self._deps[key] = deps
                if stack:
                    stack[-1] |= deps
                return value
        stack.append(set())
        try:
            value = compute()
        finally:
            deps = frozenset(stack.pop())
        self._deps[key] = deps
        if stack:
            stack[-1] |= deps
        return value

    def _equal(self, dep: tuple) -> bool:
        """Whether what ``dep`` names has the same value here as in the prior walk."""
        hit = self._same.get(dep)
        if hit is None:
            p = self.prior
            if dep[0] == "b":
                hit = self._comparable(self._bound(dep[1])) == p._comparable(p._bound(dep[1]))
            else:
                hit = self.stage_layers.get(dep[1]) == p.stage_layers.get(dep[1])
            self._same[dep] = hit
        return hit

    def _bound(self, name: str) -> Any:
        if self.program.bindings[name].keyword == "option":
            return self.options[name]
        return self.symbols[name] if self.keeps(name) else self.values[self.symbols[name]]

    def binding(self, name: str) -> Any:
        if getattr(self, "_stack", None):
            self._stack[-1].add(("b", name))
        return super().binding(name)

    def _aggregate(self, node: Any, ctx: Ctx) -> Any:
        self._reads_stage(ctx)
        return super()._aggregate(node, ctx)

    def _after(self, node: Any, ctx: Ctx) -> Any:
        self._reads_stage(ctx)
        return super()._after(node, ctx)

    def _reads_stage(self, ctx: Ctx) -> None:
        stage = dict(ctx.extra).get("stage")
        if getattr(self, "_stack", None) and stage is not None:
            self._stack[-1].add(("sl", int(stage)))

    def _comparable(self, v: Any) -> Any:
        """``v`` as compared between two walks (a backend may compare arrays by content)."""
        return v

    def _compatible(self, prior: Any) -> bool:
        return True
