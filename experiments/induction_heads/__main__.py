import sys

from workbench.cli import main

main(["run", "induction-heads", *sys.argv[1:]])
