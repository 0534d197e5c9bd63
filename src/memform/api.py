"""The public Python API: load a config, bind it to its formula files, and estimate every stage.

    >>> import memform
    >>> est = memform.estimate("configs/llama2-7b.yaml", overrides={"parallel.tp": 2})
    >>> est.peak_bytes, est.stages[0].values["activations"]

This module is the stable face of the packages below it; the implementation lives in
:mod:`memform.engine.model` (estimates, the interpreter), :mod:`memform.fastpath.fastcache`
(the compiled, cached numeric fast path) and :mod:`memform.lang.loader` (formula programs).
"""

from __future__ import annotations

from typing import Any, Mapping

from .fastpath.fastcache import FastEstimate, fast_estimate
from .engine import model as _model
from .engine.interpreter import CATEGORIES, StageResult
from .engine.model import (
                           ConfigSource,
                           Estimate,
                           Model,
                           estimate_model,
                           load_model,
                           partition_of,
                           rebind,
                           stack_items,
)
from .lang.loader import load_program

__all__ = ["CATEGORIES", "ConfigSource", "Estimate", "FastEstimate", "Model", "StageResult", "estimate",
           "estimate_model", "load_model", "load_program", "partition_of", "rebind", "stack_items"]


def estimate(config: ConfigSource, overrides: Mapping[str, Any] | list[str] | None = None, *,
             resolve: bool = True, keep: frozenset[str] | None = None, cache: bool = True) -> Any:
    """Estimate per-stage peak memory of ``config`` (path or mapping), with dotted ``overrides``.

    The numbers come from the compiled fast path where it applies (a :class:`FastEstimate`,
    byte-identical to the interpreter's; its closed forms are computed on first use), else
    from the interpreter (an :class:`Estimate`). ``resolve``/``keep`` other than the defaults
    ask for particular closed forms and always use the interpreter; ``cache=False`` skips the
    on-disk cache of compiled structures.
    """
    if resolve and keep is None:
        fast = fast_estimate(config, overrides, cache=cache)
        if fast is not None:
            return fast
    return _model.estimate(config, overrides, resolve=resolve, keep=keep)
