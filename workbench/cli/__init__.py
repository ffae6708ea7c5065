"""The ``workbench`` command line.

Every command that produces results creates a run and prints its folder as the last line
of its output. Run ``workbench --help`` or ``workbench COMMAND --help`` for the options.

:func:`main` is the one boundary between the library and the terminal. Whatever goes
wrong ends in a single line on stderr, ``error: ...``, and one of three exit statuses;
never a Python traceback unless ``-v`` asks for it (it is then printed above the line):

- **2, bad input**: the command as given cannot run. A usage error or an option out of
  range (every numeric option has both bounds: ``--limit``, ``--topk``, ``--rows`` and
  ``--max-batch-tokens`` in 1..2**20, ``--port`` in 1..65535, ``--cpus`` in 1..1024,
  ``--gpus`` in 0..64; ``--topk`` also at most the model's context), a run store
  (``--out``, ``--runs``, ``WORKBENCH_RUNS_DIR``) that is not a folder or cannot be
  written, and every :class:`WorkbenchError` the library raises: an unknown name, a
  ``--set`` value of the wrong type or out of range, a malformed head mask or claims
  file, a ``--file`` or prompt-set file that is not a regular file, is larger than 16
  MiB or is not UTF-8 text, a prompt too long for the model's context, a model that
  cannot do what an experiment needs. These are checked before a run exists, so bad
  input leaves no run behind.
- **1, runtime failure**: the work started and the machine failed it: a full disk
  (ENOSPC), a read-only file system (EROFS), a permission denied or any other
  :class:`OSError`, text that is not valid UTF-8, out of memory. The line says what
  failed and where ("cannot write the run store /x: [Errno 28] No space left on
  device"); a run that had started is stored as ``failed`` with the cause. Any other
  exception is a bug and also exits 1, as ``error: internal error: <type>: <message>``.
- **130, interrupted**: Ctrl-C (SIGINT) or SIGTERM, also when the command stops
  cleanly on it (the dashboard's server); a run that had started is stored as failed.

Where each part lives:

- :mod:`~workbench.cli.boundary`: :func:`main`, the signals, the run-store check and the
  one-line errors and exit statuses above.
- :mod:`~workbench.cli.parser`: :func:`build_parser`, every command's options and their
  argparse types, ``run``'s ``--help``.
- :mod:`~workbench.cli.render`: tables, wrapped text, durations and the tqdm progress bars;
  stored text is printed inert (:func:`workbench.core.errors.printable`).
- one module per group of commands: :mod:`~workbench.cli.models` (``models``, ``fetch``,
  ``verify``, ``prompts``), :mod:`~workbench.cli.record`, :mod:`~workbench.cli.experiments`
  (``run``, ``experiments``, ``demo`` and the experiment help),
  :mod:`~workbench.cli.runs` (``runs``, ``show``), :mod:`~workbench.cli.compare`
  (``compare``), :mod:`~workbench.cli.reproduce`,
  :mod:`~workbench.cli.sweep` and :mod:`~workbench.cli.dashboard`. Their heavy imports stay
  inside the command functions, so the CLI starts fast and refuses bad names before any
  model loads.
"""

from workbench.cli.boundary import main
from workbench.cli.experiments import experiment_help, experiment_list
from workbench.cli.parser import build_parser
from workbench.cli.render import _TqdmBars

__all__ = ["_TqdmBars", "build_parser", "experiment_help", "experiment_list", "main"]
