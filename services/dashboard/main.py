"""`trainyard dashboard`: the live web dashboard (TrainJobs, timelines, pods and logs, services)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

HELP = "Serve the live web dashboard: TrainJobs, their timelines, pods and logs, the services and backlog."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)
    parser.add_argument("--clusters", default=os.environ.get("TRAINYARD_DASHBOARD_CLUSTERS") or None,
                        help="comma-separated cluster names to show (default: --cluster) "
                             "(env TRAINYARD_DASHBOARD_CLUSTERS)")
    parser.add_argument("--stack-state", type=Path, default=None,
                        help="a local stack's stack.json: services, their readiness and restarts, and each "
                             "cluster's kubeconfig (`trainyard up` passes it)")


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, run_service

    config = config_from_args("dashboard", args)
    clusters = [c.strip() for c in (args.clusters or config.cluster).split(",") if c.strip()]

    async def main(stop) -> None:
        from trainyard_services.dashboard.server import serve

        await serve(config, clusters, args.stack_state, stop)

    return run_service(config, main)
