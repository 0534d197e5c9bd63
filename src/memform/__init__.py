"""memform: per-stage training memory of large language models, from declarative formulas.

Packages, by concern (dependencies point one way: lang <- engine <- analysis / report <- cli):
``lang`` (the formula language), ``engine`` (configs, binding, evaluation, stage sums),
``analysis`` (derive, solve, search), ``report`` (rendering), ``importers`` (other tools'
configs), ``validation`` (PyTorch ground truth), ``cli`` (commands). See docs/architecture.md.

The public names (``memform.estimate``, ...) are imported on first use, so that commands
which need no closed forms start without loading sympy.
"""

from __future__ import annotations

import os
from typing import Any

# sympy memoizes its core constructors in LRU caches of SYMPY_CACHE_SIZE entries (default 1000,
# read once, when sympy is imported). Building one structure's closed forms touches far more
# distinct sub-expressions than that, so the default cache thrashes: 20,000 entries made a
# 1024-device search's compile about 16 % faster (measured in one process; compare the compile line of
# `SYMPY_CACHE_SIZE=1000 python bench/search_speed.py` with a plain run). A user's own setting wins.
os.environ.setdefault("SYMPY_CACHE_SIZE", "20000")

__all__ = ["Estimate", "MemformError", "Model", "estimate", "estimate_model", "load_model", "load_program",
           "rebind"]
from .resources import VERSION as __version__  # noqa: F401 (memform.__version__)


def __getattr__(name: str) -> Any:
    if name == "MemformError":
        from .errors import MemformError
        return MemformError
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'memform' has no attribute {name!r}")
