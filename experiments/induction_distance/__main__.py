import sys

from workbench.cli import main

main(["run", "induction-distance", *sys.argv[1:]])
