"""`python -m tfopt.cli ...`: how local worker processes are started (the console script may not be on PATH)."""

import sys

from tfopt.cli.commands import main

if __name__ == "__main__":  # tools that import every module (doctest discovery) must not run the program
    sys.exit(main())
