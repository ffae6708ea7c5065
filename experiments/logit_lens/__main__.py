import sys

from workbench.cli import main

main(["run", "logit-lens", *sys.argv[1:]])
