"""`trainyard applier`: server-side apply of planned objects, monotonic per TrainJob."""
from __future__ import annotations

import argparse
import os

HELP = "Apply planned objects with server-side apply (field manager trainer), newest plan wins."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)
    parser.add_argument("--claim-lease", default=os.environ.get("TRAINYARD_CLAIM_LEASE", "30"),
                        help="seconds a claim on a TrainJob stays valid if its applier dies "
                             "(env TRAINYARD_CLAIM_LEASE)")


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, run_service, seconds_flag

    config = config_from_args("applier", args)
    lease = seconds_flag(args.claim_lease, "--claim-lease")

    async def main(stop) -> None:
        from trainyard.host.runtime import ServiceRuntime
        from trainyard_services.applier.service import Applier

        runtime = ServiceRuntime(config)
        try:
            await runtime.start(stop)
            applier = Applier(runtime.bus, runtime.kube, config.cluster, lease_s=lease,
                              ack_wait_s=max(config.ack_wait_s, lease))
            await applier.subscriber().run(stop)
        finally:
            await runtime.close()

    return run_service(config, main)
