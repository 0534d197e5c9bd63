"""Presenting estimates: Jinja2 rendering (text, Markdown, HTML, LaTeX), charts, matplotlib plots.

Templates live in ``templates/`` beside this file; the chart colours and axis are shared by
the HTML report and ``memform plot`` (``chart``).

May import: :mod:`memform.engine`, :mod:`memform.analysis` (comparisons), :mod:`memform.lang`,
:mod:`memform.errors`, :mod:`memform.resources`, :mod:`memform.units`. Never :mod:`memform.cli`.
"""
