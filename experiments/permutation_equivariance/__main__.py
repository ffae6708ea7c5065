"""``python -m experiments.permutation_equivariance --model minilm``: the CLI's ``run``."""

import sys

from workbench.cli import main

main(["run", "permutation-equivariance", *sys.argv[1:]])
