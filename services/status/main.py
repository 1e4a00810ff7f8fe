"""`trainyard status`: fold JobSet status and apply results into TrainJob.status."""
from __future__ import annotations

import argparse
import os

from trainyard.errors import UserError

HELP = "Fold JobSet status and apply results into TrainJob status; look after runtime finalizers."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.compat import add_compat_argument
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)
    add_compat_argument(parser)
    env = os.environ.get
    parser.add_argument("--trainjob-status-port", default=env("TRAINYARD_TRAINJOB_STATUS_PORT", "off"),
                        help="feature gate TrainJobStatus (v2.3.0, off by default): HTTPS port of the endpoint "
                             "trainer pods report progress to; 'off' serves none (env TRAINYARD_TRAINJOB_STATUS_PORT)")
    parser.add_argument("--trainjob-status-host", default=env("TRAINYARD_TRAINJOB_STATUS_HOST", "127.0.0.1"),
                        help="bind address of that endpoint (env TRAINYARD_TRAINJOB_STATUS_HOST)")
    parser.add_argument("--trainjob-status-cert-dir", default=env("TRAINYARD_TRAINJOB_STATUS_CERT_DIR"),
                        help="directory with its tls.crt and tls.key (env TRAINYARD_TRAINJOB_STATUS_CERT_DIR)")


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, port_or_off, run_service

    from trainyard.compat import compat_from_args

    config = config_from_args("status", args)
    compat = compat_from_args(args, UserError)
    status_port = port_or_off(args.trainjob_status_port, "--trainjob-status-port")
    if status_port is not None and not args.trainjob_status_cert_dir:
        raise UserError("--trainjob-status-port needs --trainjob-status-cert-dir")

    async def main(stop) -> None:
        from trainyard.host.runtime import ServiceRuntime
        from trainyard_services.status.service import StatusService, run_status

        runtime = ServiceRuntime(config)
        endpoint = None
        try:
            await runtime.start(stop)
            if status_port is not None:
                from trainyard_services.status.progress import history_recorder, serve

                recorder = history_recorder(runtime.bus.publisher, config.cluster)
                endpoint = await serve(runtime.kube, args.trainjob_status_host, status_port,
                                       args.trainjob_status_cert_dir, on_report=recorder)
            await run_status(StatusService(runtime.bus, runtime.kube, config.cluster, config.ack_wait_s, compat), stop)
        finally:
            if endpoint is not None:
                await endpoint.cleanup()
            await runtime.close()

    return run_service(config, main)
