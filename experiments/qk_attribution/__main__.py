import sys

from workbench.cli import main

main(["run", "qk-attribution", *sys.argv[1:]])
