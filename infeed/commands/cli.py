"""The ``infeed`` command: parses the command line and hands it to the subcommand's module.

Each subcommand lives in its own module, which defines ``HELP`` (one line),
``add_arguments(parser)``, ``run(args) -> int`` and ``USAGE_ERRORS`` (the
exceptions meaning the command cannot run as asked).  This file only
dispatches, and turns expected failures into a message and an exit status:

- 0: done;
- 1: the data is damaged or an I/O operation failed (a corrupt record, a
  network error);
- 2: the command cannot run as asked (bad arguments, a missing input, an
  unsupported column).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from infeed.errors import InfeedError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Subcommand -> the module that implements it.
COMMANDS = {name: f"infeed.commands.{name}" for name in ("convert", "inspect", "index", "serve", "stats", "gc")}

#: Missing or unusable inputs: the command cannot run as asked.
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def build_parser() -> argparse.ArgumentParser:
    """The ``infeed`` argument parser, with one subparser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="infeed", description="TFRecord tools: convert tables to "
                                     "TFRecord files, inspect what a file holds, serve batches from a decoding "
                                     "daemon and look after its shared-memory rings.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, usage_errors=module.USAGE_ERRORS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs ``infeed`` with ``argv`` (default ``sys.argv[1:]``) and returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:                      # --help, or a usage error argparse has printed
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.run(args)
    except args.usage_errors + _MISSING as e:
        return _fail(args.command, e, 2)
    except (InfeedError, OSError) as e:
        if isinstance(e, BrokenPipeError):       # `infeed inspect ... | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        return _fail(args.command, e, 1)
    except KeyboardInterrupt:
        return 130


def _fail(command: str, error: BaseException, status: int) -> int:
    print(f"infeed {command}: error: {error}", file=sys.stderr)
    return status
