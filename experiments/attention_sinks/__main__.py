import sys

from workbench.cli import main

main(["run", "attention-sinks", *sys.argv[1:]])
