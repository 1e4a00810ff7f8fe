"""`trainyard status`: fold JobSet status and apply results into TrainJob.status."""
from __future__ import annotations

import argparse

HELP = "Fold JobSet status and apply results into TrainJob status; keep runtime finalizers."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.telemetry.service import add_common_flags

    add_common_flags(parser)


def run(args: argparse.Namespace) -> int:
    from trainyard.telemetry.service import config_from_args, run_service

    config = config_from_args("status", args)

    async def main(stop) -> None:
        from trainyard.telemetry.runtime import ServiceRuntime
        from trainyard_services.status.service import StatusService, run_status

        runtime = ServiceRuntime(config)
        try:
            await runtime.start(stop)
            await run_status(StatusService(runtime.bus, runtime.kube, config.cluster, config.ack_wait_s), stop)
        finally:
            await runtime.close()

    return run_service(config, main)
