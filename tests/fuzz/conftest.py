"""Property-based fuzzing with Hypothesis: arbitrary values of the right and wrong shapes
for every stored file, every ``--set`` field and every dashboard callback.

Two profiles: ``ci`` (the default: a fixed seed and a budget that fits ``make test``) and
``fuzz`` (``make fuzz``: many more examples, for before a release; its statistics print
the count of examples tried). Choose one with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow,
                                                       HealthCheck.function_scoped_fixture]}
settings.register_profile("ci", max_examples=60, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("fuzz", max_examples=5000, derandomize=False, print_blob=True,
                          **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
