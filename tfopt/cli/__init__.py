"""`tfopt-recipe`, the command line: `commands` parses and dispatches, `options` reads the shared flags,
`progress` draws what a person watches. `python -m tfopt.cli` is the same program.

Importing it does not import TensorFlow, so `tfopt-recipe --help` stays instant.
"""

from tfopt.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
