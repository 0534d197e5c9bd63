"""Ground truth for the formulas: build small real PyTorch models from a memform config, run one
training step on the CPU and measure which bytes are really live, by category.

Needs the optional ``validate`` extra (CPU PyTorch). Nothing in the estimator imports this package;
``bench/validate.py`` runs the full sweep and ``tests/test_validate.py`` a small subset.

May import: :mod:`memform.engine`, :mod:`memform.allocator` (replaying traces) and the public :mod:`memform.api`; nothing imports it.
"""
