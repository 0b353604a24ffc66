"""`gpuwm controller|agent|api|demo|replay|report|version`.

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

#: each verb and the module that registers it, in the order `gpuwm --help` lists them
_VERB_MODULES = {
    "controller": "gpuwm.controller.command",
    "agent": "gpuwm.agent.command",
    "api": "gpuwm.api.command",
    "demo": "gpuwm.sim.command",
    "replay": "gpuwm.accounting.replay_command",
    "report": "gpuwm.api.report_command",
}


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or of `verb` alone: then only its module is imported. A verb module
    imports what its verb runs at the top (the controller's kopf and aiohttp), and the agent on
    every GPU node should not carry the controller's."""
    parser = argparse.ArgumentParser(prog="gpuwm", description="GPU workload metrics for Kubernetes.")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    wanted = [_VERB_MODULES[verb]] if verb in _VERB_MODULES else list(_VERB_MODULES.values())
    for module_name in wanted:
        importlib.import_module(module_name).register(subparsers)
    version_parser = subparsers.add_parser("version", help="print the gpuwm version")
    version_parser.set_defaults(handler=lambda _arguments: print(f"gpuwm {__version__}") or 0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    arguments = parser.parse_args(words)
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
