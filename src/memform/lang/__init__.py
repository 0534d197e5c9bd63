"""The formula language: syntax tree, parser, printer, program loading and static checks.

Owns ``grammar/memform.lark`` and everything that turns ``.mf`` text into a checked
:class:`~memform.lang.program.Program`. No config or number is seen here.

May import: :mod:`memform.errors`, :mod:`memform.resources`. Nothing else of memform.
Inside: ``ast`` <- ``transform`` (lark's tree → ast) <- ``parser`` <- ``program`` <- ``checker`` <- ``loader``;
``printer`` uses ``ast``. lark is imported by ``transform`` and on a parse only (a cached syntax tree needs none).
"""
