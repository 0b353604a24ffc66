"""`gpuwm controller|agent|api|demo|replay|version`.

Each verb lives in its component as a `command` module with `register(subparsers)`;
this file only wires them together so components stay independent.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpuwm import __version__
from gpuwm.config import ConfigError

#: verb modules, in the order `gpuwm --help` lists them
_COMMAND_MODULES = (
    "gpuwm.controller.command",
    "gpuwm.agent.command",
    "gpuwm.api.command",
    "gpuwm.sim.command",
    "gpuwm.accounting.replay_command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuwm", description="GPU workload metrics for Kubernetes.")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:  # the component is not built yet
                continue
            raise
        module.register(subparsers)
    version_parser = subparsers.add_parser("version", help="print the gpuwm version")
    version_parser.set_defaults(handler=lambda _arguments: print(f"gpuwm {__version__}") or 0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    handler = getattr(arguments, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(arguments) or 0)
    except ConfigError as error:
        print(f"gpuwm: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
