import sys

from workbench.cli import main

main(["run", "circuit", *sys.argv[1:]])
