"""`trainyard watcher`: list+watch trainer objects and publish their changes onto JetStream."""
from __future__ import annotations

import argparse

HELP = "Watch TrainJobs, runtimes, JobSets and PodGroups and publish changes to NATS JetStream."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, run_service

    config = config_from_args("watcher", args)

    async def main(stop) -> None:
        from trainyard.host.runtime import ServiceRuntime
        from trainyard_services.watcher.service import run_watcher

        runtime = ServiceRuntime(config)
        try:
            await runtime.start(stop)
            await run_watcher(runtime.bus, runtime.kube, config.cluster, stop)
        finally:
            await runtime.close()

    return run_service(config, main)
