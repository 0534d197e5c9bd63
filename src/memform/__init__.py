"""memform: per-stage training memory of large language models, from declarative formulas."""

from .api import Estimate, Model, estimate, estimate_model, load_model
from .errors import MemformError
from .program import load_program

__all__ = ["Estimate", "MemformError", "Model", "estimate", "estimate_model", "load_model", "load_program"]
__version__ = "0.1.0"
