"""The `fleet` command line: one sub-command per module in `fleet/commands/`.

Each command module defines ``add_parser(subparsers) -> argparse.ArgumentParser`` and sets
``func=run`` on it, where ``run(args) -> int``. Command modules keep heavy imports (torch,
mpi4py, matplotlib) inside ``run`` so that ``fleet --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from fleet import __version__, interrupts
from fleet.errors import UserError

COMMANDS = (
    "run",
    "train",
    "profile",
    "plan",
    "simulate",
    "submit",
    "report",
    "ensemble",
    "predict",
    "status",
    "validate",
    "data",
)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line on stderr and exit 2 (no usage dump).

    Sub-command parsers inherit the class, so `fleet data make --samples x` reports
    ``fleet data make: error: argument --samples: invalid int value: 'x'``.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(UserError.exit_code)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fleet",
        description="Train an ensemble of heterogeneous deep nets on an MPI job.",
    )
    parser.add_argument("--version", action="version", version=f"fleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"fleet.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fleet.commands.{name}":
                continue  # command not built yet
            raise
        module.add_parser(subparsers)
    return parser




def main(argv: list[str] | None = None) -> int:
    interrupts.install()  # a KeyboardInterrupt that user code raises is then not taken for a Ctrl-C
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"fleet {args.command}: error: {exc}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print(f"fleet {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`fleet validate spec | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1
