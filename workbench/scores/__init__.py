"""What is measured: pattern metrics, head scores, losses, embeddings, statistics.

``patterns`` (every per-head pattern metric), ``heads`` (scores with intervals and nulls,
ranking, copying), ``losses`` and ``embeddings`` (per example), ``stats`` (bootstrap),
``streaming`` (losses under limited attention), ``phase_change`` (curves over training),
``attention`` (a readable reference attention).
"""
