"""The compiled and vectorized fast paths: a config's structure turned into code or walked over
candidate columns, and the on-disk store of what was compiled.

* ``exact`` (closed forms → exact numpy and BigInt JavaScript code), ``compiled`` (a search's or a
  page's structures compiled, in worker processes, stored), ``vecwalk`` (a structure's candidates
  walked numerically without compiling), ``sharedmemo`` (walks of related structures sharing values);
* ``fastcache``, ``fastcompile``, ``scalar``: the compiled fast path of ``memform estimate``;
* ``cachestore``: entries in the cache directory (:mod:`memform.cachedir`).

Everything here starts from a bound :class:`~memform.engine.model.Model` and gives the numbers the
interpreter gives; the analyses (search, solve, derive, compare) live in :mod:`memform.analysis`.

May import: :mod:`memform.engine`, :mod:`memform.allocator`, :mod:`memform.lang`, :mod:`memform.errors`,
:mod:`memform.units`, :mod:`memform.resources`, :mod:`memform.cachedir`. Never :mod:`memform.analysis`,
:mod:`memform.report` or :mod:`memform.cli`.
"""
