"""memform: per-stage training memory of large language models, from declarative formulas.

Packages, by concern (dependencies point one way: lang <- engine <- analysis / report <- cli):
``lang`` (the formula language), ``engine`` (configs, binding, evaluation, stage sums),
``analysis`` (derive, solve, search), ``report`` (rendering), ``importers`` (other tools'
configs), ``validation`` (PyTorch ground truth), ``cli`` (commands). See docs/architecture.md.
"""

from .api import Estimate, Model, estimate, estimate_model, load_model, load_program, rebind
from .errors import MemformError

__all__ = ["Estimate", "MemformError", "Model", "estimate", "estimate_model", "load_model", "load_program",
           "rebind"]
__version__ = "0.1.0"
