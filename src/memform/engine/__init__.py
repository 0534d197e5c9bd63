"""Evaluation: config loading and validation, binding, the evaluators (sympy and numeric), stage partition and interpreter.

Turns a YAML config plus a :class:`~memform.lang.program.Program` into a bound
:class:`~memform.engine.model.Model` and then an :class:`~memform.engine.model.Estimate`
(per-stage, per-category exact bytes and closed forms).

May import: :mod:`memform.lang`, :mod:`memform.allocator` (the reserved figure), :mod:`memform.errors`, :mod:`memform.resources`, :mod:`memform.units`.
Inside: ``walker`` (the formula walk) <- ``evaluator`` (sympy) / ``numeric`` (int, Fraction) <- ``binding``
<- ``config``; ``partition``; ``interpreter`` (per-stage sums);
``model`` ties them together; ``symbolic`` presents closed forms.
"""
