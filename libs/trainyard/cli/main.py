"""The single `trainyard` command line entry.

Each subcommand is a module exposing ``HELP`` (one line), ``configure(parser)`` and
``run(args) -> int``. Modules are named here as strings and imported when the command
line is built, so a command module must keep its top-level imports light (import heavy
packages inside ``run``). A command line that starts with a command's name imports that
command's module only: every service process starts through here, and importing all of them
cost each start a fifth of a second. Adding a command is one line in ``COMMANDS``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from trainyard.errors import UserError

COMMANDS: dict[str, str] = {
    "watcher": "trainyard_services.watcher.main",
    "planner": "trainyard_services.planner.main",
    "applier": "trainyard_services.applier.main",
    "status": "trainyard_services.status.main",
    "dispatcher": "trainyard_services.dispatcher.main",
    "dashboard": "trainyard_services.dashboard.main",
    "devcluster": "trainyard_services.devcluster.cli",
    "up": "trainyard.cli.up",
    "down": "trainyard.cli.down",
    "crds": "trainyard.cli.crds",
    "plan": "trainyard.cli.plan",
    "validate": "trainyard.cli.validate",
    "demo": "trainyard.cli.demo",
    "bus": "trainyard.cli.bus",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only``: with that command alone (its module the only one imported)."""
    parser = argparse.ArgumentParser(
        prog="trainyard",
        description="Kubeflow Trainer v2 compatible training control plane on NATS JetStream.",
    )
    from trainyard.packaged import version

    parser.add_argument("--version", action="version", version=f"trainyard {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
