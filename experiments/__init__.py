"""Experiments: one module each, discovered by ``workbench.harness.experiment.discover``.

Each module states the question it answers and the paper it follows, and defines a frozen
``Config``, a ``run(model, cfg) -> Result`` registered with ``@experiment(...)``, and a
result whose ``tables()`` are long-format DataFrames.
"""
