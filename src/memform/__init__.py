"""memform: per-stage training memory of large language models, from declarative formulas.

Packages, by concern (dependencies point one way: lang <- engine <- analysis / report <- cli):
``lang`` (the formula language), ``engine`` (configs, binding, evaluation, stage sums),
``analysis`` (derive, solve, search), ``report`` (rendering), ``importers`` (other tools'
configs), ``validation`` (PyTorch ground truth), ``cli`` (commands). See docs/architecture.md.

The public names (``memform.estimate``, ...) are imported on first use, so that commands
which need no closed forms start without loading sympy.
"""

from __future__ import annotations

from typing import Any


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
