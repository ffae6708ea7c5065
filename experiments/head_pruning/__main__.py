import sys

from workbench.cli import main

main(["run", "head-pruning", *sys.argv[1:]])
