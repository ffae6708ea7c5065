"""Figures a notebook and the dashboard share: every figure a page draws is made by a
function here, from the run's tables or the recording's patterns, so ``run.figure(...)``,
``rec.show_pattern(...)`` and the page cannot disagree. Imports only plotly, numpy, pandas
and :mod:`workbench.core`, so the run store and the recording reader can call it.

``style`` (colour scales, titles, the pattern and head heatmaps), ``patterns`` (a
recording's pattern, the pooled long-context overview), ``heads``, ``curves`` (pruning,
formation), ``qk`` (the Why page's bars), ``catalog`` (the named figures of a run),
``pages`` (which dashboard page shows which experiment), ``html`` (notebook reprs).
"""
