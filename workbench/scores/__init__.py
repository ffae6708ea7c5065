"""What is measured: pattern metrics, head scores, losses, embeddings, statistics.

``metrics`` (every head metric declared once: name, meaning, null, source, scale),
``patterns`` (the per-head pattern metrics' functions), ``heads`` (scores with intervals and
nulls, ranking, copying), ``losses`` and ``embeddings`` (per example), ``stats`` (bootstrap),
``paired`` (two runs' values of the same prompts: paired bootstrap interval, sign-flip p-value),
``streaming`` (losses under limited attention), ``phase_change`` (curves over training),
``attention`` (a readable reference attention).
"""
