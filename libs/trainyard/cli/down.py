"""`trainyard down`: stop the stack `trainyard up` started on a data dir, leaving no process behind."""
from __future__ import annotations

import argparse
from pathlib import Path

from trainyard.errors import UserError

HELP = "Stop the local trainyard started by `trainyard up` (services, devcluster and its pods, NATS)."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.supervisor.layout import DATA_DIR_ENV, default_data_dir

    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"the data dir given to `trainyard up` (default: ${DATA_DIR_ENV} or {default_data_dir()})")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for a clean stop before killing what is left (default 60)")


def run(args: argparse.Namespace) -> int:
    from trainyard.supervisor.layout import StackLayout, default_data_dir
    from trainyard.supervisor.shutdown import stop_stack

    layout = StackLayout.at(args.data_dir or default_data_dir())
    if not layout.root.is_dir():
        raise UserError(f"--data-dir: {layout.root} does not exist")
    report = stop_stack(layout, timeout_s=args.timeout, say=lambda line: print(line, flush=True))
    if report.supervisor_stopped:
        print(f"trainyard: stopped the stack in {layout.root} (supervisor pid {report.supervisor_pid})")
    if report.killed:
        print(f"trainyard: killed leftover processes: {', '.join(report.killed)}")
    from trainyard.supervisor.userkube import remove_from_user_kubeconfig

    merged = remove_from_user_kubeconfig(layout.root)
    if merged is not None:
        print(f"trainyard: removed context {merged.name} from {merged.path}")
    if not report.found_anything:
        print(f"trainyard: nothing running in {layout.root}")
    return 0
