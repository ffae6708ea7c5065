"""Sweeps: one spec of experiments x models x configs run as many ordinary runs, on Ray, into
one ``sweep`` run.

``spec`` reads a TOML spec (the ``Spec`` record) and expands it into cells before anything
runs; ``runner`` runs the cells resumably and stores the sweep run (``workbench sweep``);
``cluster`` is the only module that imports Ray: joining or starting it, the store probe
from the workers, the task that runs one cell; ``tables`` declares the sweep run's tables,
importable without torch or Ray.

Nothing is imported here: the command line's parser reads ``cluster``'s checks, and that
must not load the rest.
"""
