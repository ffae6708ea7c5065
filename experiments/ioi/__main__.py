import sys

from workbench.cli import main

main(["run", "ioi", *sys.argv[1:]])
