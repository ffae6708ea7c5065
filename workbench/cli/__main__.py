"""``python -m workbench.cli``, as ``workbench``."""

from workbench.cli import main

main()
