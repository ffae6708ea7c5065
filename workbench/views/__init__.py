"""Everything drawn: every figure a dashboard page or a notebook shows, the notebook cards of
a run, a recording and a model, and the table of which page shows which run kind. Views sit
above the harness and import downwards; no data object below knows how it is drawn.

``style`` (colour scales, titles, the pattern and head heatmaps), ``patterns`` (a
recording's pattern, the pooled long-context overview; ``show_pattern``, ``show_long``),
``heads``, ``curves`` (pruning, formation), ``qk`` (the Why page's bars), ``catalog`` (the
named figures of a run: ``workbench.figure``), ``cards`` and ``html`` (notebook cards),
``pages`` (which dashboard page shows which experiment).
"""
