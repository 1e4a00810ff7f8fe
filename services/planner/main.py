"""`trainyard planner`: plan TrainJobs from bus events and serve the validating webhooks."""
from __future__ import annotations

import argparse
import os

from trainyard.errortext import describe
from trainyard.errors import UserError

HELP = "Plan TrainJobs (runtime + plugins -> desired objects) and serve the admission webhooks."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.compat import add_compat_argument
    from trainyard.host.service import add_common_flags

    add_common_flags(parser)
    add_compat_argument(parser)
    env = os.environ.get
    parser.add_argument("--webhook-port", default=env("TRAINYARD_WEBHOOK_PORT", "9443"),
                        help="HTTPS port of the admission webhooks; 0 picks a free port, "
                             "'off' disables them (env TRAINYARD_WEBHOOK_PORT)")
    parser.add_argument("--webhook-host", default=env("TRAINYARD_WEBHOOK_HOST", "127.0.0.1"),
                        help="bind address of the webhook server (env TRAINYARD_WEBHOOK_HOST)")
    parser.add_argument("--webhook-url", default=env("TRAINYARD_WEBHOOK_URL"),
                        help="base URL the API server calls (e.g. https://127.0.0.1:9443); default: "
                             "https://<webhook-host>:<bound port> unless --webhook-service is set "
                             "(env TRAINYARD_WEBHOOK_URL)")
    parser.add_argument("--webhook-service", default=env("TRAINYARD_WEBHOOK_SERVICE"),
                        help="Service name the API server calls in a real cluster, e.g. "
                             "kubeflow-trainer-controller-manager (env TRAINYARD_WEBHOOK_SERVICE)")
    parser.add_argument("--webhook-namespace", default=env("TRAINYARD_WEBHOOK_NAMESPACE", "kubeflow-system"),
                        help="namespace of the webhook Service and certificate Secret "
                             "(env TRAINYARD_WEBHOOK_NAMESPACE)")
    parser.add_argument("--trainjob-status-url", default=env("TRAINYARD_TRAINJOB_STATUS_URL"),
                        help="feature gate TrainJobStatus (v2.3.0, off by default): the status endpoint as trainer "
                             "pods reach it, https://<service>.<namespace>.svc:<port>; trainer pods then get its URL, "
                             "CA and a projected token (env TRAINYARD_TRAINJOB_STATUS_URL)")
    parser.add_argument("--trainjob-status-ca-file", default=env("TRAINYARD_TRAINJOB_STATUS_CA_FILE"),
                        help="PEM of the CA that signed the status endpoint's certificate "
                             "(env TRAINYARD_TRAINJOB_STATUS_CA_FILE)")
    parser.add_argument("--webhook-drain", default=env("TRAINYARD_WEBHOOK_DRAIN", "5"),
                        help="seconds the webhook keeps answering after SIGTERM while /readyz already says "
                             "not ready, so the Service stops routing to this replica before it closes "
                             "(env TRAINYARD_WEBHOOK_DRAIN)")
    parser.add_argument("--cert-check-interval", default=env("TRAINYARD_CERT_CHECK_INTERVAL", "60"),
                        help="seconds between certificate expiry checks (env TRAINYARD_CERT_CHECK_INTERVAL)")


def run(args: argparse.Namespace) -> int:
    from trainyard.host.service import config_from_args, port_or_off, run_service, seconds_flag

    config = config_from_args("planner", args)
    webhook_port = port_or_off(args.webhook_port, "--webhook-port")
    check_interval = seconds_flag(args.cert_check_interval, "--cert-check-interval")
    drain_s = seconds_flag(args.webhook_drain, "--webhook-drain", zero_allowed=True)
    if args.webhook_url and not str(args.webhook_url).startswith("https://"):
        raise UserError(f"--webhook-url: must start with https://, got {args.webhook_url!r}")
    plugins = _plugins(args, UserError)
    from trainyard.compat import compat_from_args

    compat = compat_from_args(args, UserError)

    async def main(stop) -> None:
        import asyncio
        import logging

        from trainyard.host.runtime import ServiceRuntime
        from trainyard_services.planner.service import Planner, webhook_observed, webhook_trainjob

        log = logging.getLogger("trainyard_services.planner")
        runtime = ServiceRuntime(config)
        webhook = tls = manager = None
        if webhook_port is not None:
            # Registered before the health server starts: /readyz must not say ready while
            # the admission webhook (failurePolicy Fail) cannot answer yet.
            runtime.add_check("certificates", lambda: manager is not None and manager.ready)
            # Not ready from the moment a stop is asked: endpoints drop this replica while its
            # webhook still answers for --webhook-drain seconds (the finally below).
            runtime.add_check("not-stopping", lambda: not stop.is_set())
        tasks = []
        try:
            await runtime.start(stop)
            planner = Planner(runtime.bus, config.cluster, config.ack_wait_s, plugins, compat)
            if webhook_port is not None:
                from trainyard.pipeline.validation import prepare_admission

                # Before the webhook is registered or ready: its first answer must not carry
                # the schema generation and CEL compilation (in a thread: the event loop keeps
                # answering the bus meanwhile).
                await asyncio.to_thread(prepare_admission, compat)
                from trainyard_services.planner.certmanager import CertManager
                from trainyard_services.planner.webhook import TlsFiles, WebhookServer, build_app

                tls = TlsFiles()
                app = build_app(webhook_observed(runtime.bus, runtime.kube, config.cluster),
                                webhook_trainjob(runtime.bus, runtime.kube, config.cluster), compat)
                host = args.webhook_host
                service = (args.webhook_service, args.webhook_namespace) if args.webhook_service else None
                hosts = [f"{args.webhook_service}.{args.webhook_namespace}.svc",
                         f"{args.webhook_service}.{args.webhook_namespace}.svc.cluster.local"] \
                    if service else [host if host not in ("0.0.0.0", "::") else "127.0.0.1", "localhost"]
                manager = CertManager(runtime.kube, tls, namespace=args.webhook_namespace, hosts=hosts,
                                      url_base=None, service=service, check_interval_s=check_interval,
                                      compat=compat)
                # The TLS files must exist before the server loads them; the URL needs the port.
                from trainyard_services.planner import certs
                bootstrap = certs.issue(hosts)
                tls.write(bootstrap.cert_pem, bootstrap.key_pem)
                webhook = WebhookServer(app, host, webhook_port, tls)
                bound = await webhook.start()
                manager.url_base = None if service else (args.webhook_url or f"https://{hosts[0]}:{bound}")
                log.info("webhook server listening", extra={"webhook_port": bound})
                await _retry_until(stop, manager.ensure, log)
                tasks.append(asyncio.create_task(manager.run(stop)))
            await planner.subscriber().run(stop)
        finally:
            if webhook is not None:
                if stop.is_set() and drain_s:
                    log.info("draining the webhook before exit", extra={"drain_s": drain_s})
                    await asyncio.sleep(drain_s)
                await webhook.stop()  # stops accepting, then finishes the requests in flight
            for task in tasks:
                task.cancel()
            if tls is not None:
                tls.cleanup()
            await runtime.close()

    return run_service(config, main)


def _plugins(args: argparse.Namespace, user_error: type[Exception]) -> tuple:
    """The planning plugins: REGISTRY, plus TrainJobStatus when its endpoint is given."""
    from pathlib import Path

    from trainyard.pipeline.plugins import REGISTRY
    from trainyard.pipeline.plugins.trainjobstatus import StatusEndpoint, with_trainjob_status

    if not args.trainjob_status_url:
        return REGISTRY
    if not str(args.trainjob_status_url).startswith("https://"):
        raise user_error(f"--trainjob-status-url: must start with https://, got {args.trainjob_status_url!r}")
    if not args.trainjob_status_ca_file:
        raise user_error("--trainjob-status-url needs --trainjob-status-ca-file")
    try:
        ca_pem = Path(args.trainjob_status_ca_file).read_text()
    except OSError as err:
        raise user_error(f"--trainjob-status-ca-file: {err}") from None
    return with_trainjob_status(REGISTRY, StatusEndpoint(str(args.trainjob_status_url), ca_pem))


async def _retry_until(stop, action, log) -> None:
    import asyncio

    delay = 0.2
    while not stop.is_set():
        try:
            await action()
            return
        except Exception as err:
            log.warning("webhook certificate/configuration not ready: %s", describe(err))
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass
            delay = min(delay * 2, 5.0)
