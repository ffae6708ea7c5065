import sys

from workbench.cli import main

main(["run", "head-overview", *sys.argv[1:]])
