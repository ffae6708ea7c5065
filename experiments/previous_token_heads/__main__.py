import sys

from workbench.cli import main

main(["run", "previous-token-heads", *sys.argv[1:]])
