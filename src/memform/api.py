"""The public Python API: load a config, bind it to its formula files, and estimate every stage.

    >>> import memform
    >>> est = memform.estimate("configs/llama2-7b.yaml", overrides={"parallel.tp": 2})
    >>> est.peak_bytes, est.stages[0].values["activations"]

This module is the stable face of the packages below it; the implementation lives in
:mod:`memform.engine.model` (estimates) and :mod:`memform.lang.loader` (formula programs).
"""

from __future__ import annotations

from .engine.interpreter import CATEGORIES, StageResult
from .engine.model import (
                           ConfigSource,
                           Estimate,
                           Model,
                           estimate,
                           estimate_model,
                           load_model,
                           partition_of,
                           rebind,
                           stack_items,
)
from .lang.loader import load_program

__all__ = ["CATEGORIES", "ConfigSource", "Estimate", "Model", "StageResult", "estimate", "estimate_model",
           "load_model", "load_program", "partition_of", "rebind", "stack_items"]
