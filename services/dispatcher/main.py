"""`trainyard dispatcher`: delegate the manager's TrainJobs to worker clusters (MultiKueue-style)."""
from __future__ import annotations

import argparse
import os

from trainyard.errors import UserError

HELP = ("Run TrainJobs with spec.managedBy kueue.x-k8s.io/multikueue on the worker clusters declared "
        "by MultiKueueCluster objects, and mirror their status back (manager side).")


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)
    parser.add_argument("--secrets-namespace", default=os.environ.get("TRAINYARD_SECRETS_NAMESPACE", "kubeflow-system"),
                        help="namespace of the Secrets holding the workers' kubeconfigs "
                             "(env TRAINYARD_SECRETS_NAMESPACE; default kubeflow-system)")
    parser.add_argument("--worker-lost-timeout", default=os.environ.get("TRAINYARD_WORKER_LOST_TIMEOUT", "900"),
                        help="seconds a worker may be unreachable before its TrainJobs are dispatched "
                             "elsewhere (env TRAINYARD_WORKER_LOST_TIMEOUT; default 900, as MultiKueue)")
    parser.add_argument("--probe-interval", default=os.environ.get("TRAINYARD_PROBE_INTERVAL", "2"),
                        help="seconds between reachability probes of the workers (their capacity "
                             "comes from watches) "
                             "(env TRAINYARD_PROBE_INTERVAL; default 2)")
    parser.add_argument("--resync-interval", default=os.environ.get("TRAINYARD_RESYNC_INTERVAL", "10"),
                        help="seconds between passes over the delegated TrainJobs of this replica's partitions, "
                             "which retry placement and notice lost workers "
                             "(env TRAINYARD_RESYNC_INTERVAL; default 10)")


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, run_service, seconds_flag

    config = config_from_args("dispatcher", args)
    lost_timeout = seconds_flag(args.worker_lost_timeout, "--worker-lost-timeout")
    probe = seconds_flag(args.probe_interval, "--probe-interval")
    resync = seconds_flag(args.resync_interval, "--resync-interval")
    if not args.secrets_namespace:
        raise UserError("--secrets-namespace: must not be empty")

    async def main(stop) -> None:
        import asyncio

        from trainyard.multicluster.registry import WorkerRegistry
        from trainyard.multicluster.slots import SlotLedger
        from trainyard.host.runtime import ServiceRuntime
        from trainyard_services.dispatcher.service import Dispatcher

        runtime = ServiceRuntime(config)
        registry = None
        try:
            await runtime.start(stop)
            registry = WorkerRegistry(runtime.kube, args.secrets_namespace, lost_timeout)
            slots = await SlotLedger.open(runtime.bus.js, config.cluster)
            dispatcher = Dispatcher(runtime.bus, runtime.kube, config.cluster, registry, slots,
                                    ack_wait_s=config.ack_wait_s)
            registry.on_reachable = dispatcher.worker_reachable
            runtime.add_check("kueue-multikueue-absent", lambda: not dispatcher.kueue_present)
            await asyncio.gather(dispatcher.run_loops(stop, probe, resync), dispatcher.subscriber().run(stop))
        finally:
            if registry is not None:
                await registry.close()
            await runtime.close()

    return run_service(config, main)
