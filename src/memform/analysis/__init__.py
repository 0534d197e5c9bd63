"""Working with closed forms: derive, solve, sensitivity, search, compare. The compiled and
vectorized evaluation they run on (and ``memform estimate``'s cached fast path) is :mod:`memform.fastpath`.

Everything here starts from a bound :class:`~memform.engine.model.Model` or an
:class:`~memform.engine.model.Estimate` and never reads formula text itself.

May import: :mod:`memform.engine`, :mod:`memform.fastpath`, :mod:`memform.allocator`, :mod:`memform.lang` (syntax-tree walks), :mod:`memform.errors`,
:mod:`memform.units`, :mod:`memform.resources` (bundled files, the version). Never
:mod:`memform.report` or :mod:`memform.cli`.
"""
