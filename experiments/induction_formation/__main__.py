import sys

from workbench.cli import main

main(["run", "induction-formation", *sys.argv[1:]])
