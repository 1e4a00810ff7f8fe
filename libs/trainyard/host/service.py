"""Common service scaffolding: flags/env config, logging, tracing, health server, signals.

Every service command takes the same core flags, each with an environment variable:

=================  ========================  =======================================
flag               env                       meaning
=================  ========================  =======================================
--kubeconfig       TRAINYARD_KUBECONFIG      kubeconfig file; unset: KUBECONFIG (merged),
                                             ~/.kube/config, in-cluster (as kubectl)
--context          TRAINYARD_CONTEXT         kubeconfig context instead of the current one
--nats-url         TRAINYARD_NATS_URL        NATS server URL
--http-port        TRAINYARD_HTTP_PORT       health/metrics port (0 = pick a free one)
--http-host        TRAINYARD_HTTP_HOST       health/metrics bind address
--cluster          TRAINYARD_CLUSTER         cluster name used in subjects and keys
--log-level        TRAINYARD_LOG_LEVEL       debug, info, warning, error
--shutdown-grace   TRAINYARD_SHUTDOWN_GRACE  seconds to finish in-flight work on stop
--ack-wait         TRAINYARD_ACK_WAIT        seconds before an unacknowledged message is
                                             redelivered (e.g. after a crash)
=================  ========================  =======================================
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable, NoReturn

from trainyard.errortext import describe
from trainyard.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceConfig:
    service: str
    kubeconfig: str | None
    nats_url: str
    http_host: str
    http_port: int
    cluster: str
    log_level: str
    shutdown_grace_s: float
    ack_wait_s: float = 30.0
    context: str | None = None


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=_env("TRAINYARD_KUBECONFIG"),
                        help="kubeconfig file (env TRAINYARD_KUBECONFIG); unset: as kubectl, "
                             "KUBECONFIG (several files merged), ~/.kube/config, then in-cluster")
    parser.add_argument("--context", default=_env("TRAINYARD_CONTEXT"),
                        help="kubeconfig context to use instead of the current one (env TRAINYARD_CONTEXT)")
    parser.add_argument("--nats-url", default=_env("TRAINYARD_NATS_URL", "nats://127.0.0.1:4222"),
                        help="NATS URL (env TRAINYARD_NATS_URL)")
    parser.add_argument("--http-port", default=_env("TRAINYARD_HTTP_PORT", "8080"),
                        help="port for /healthz, /readyz, /metrics; 0 picks a free port "
                             "(env TRAINYARD_HTTP_PORT)")
    parser.add_argument("--http-host", default=_env("TRAINYARD_HTTP_HOST", "127.0.0.1"),
                        help="bind address of the HTTP server (env TRAINYARD_HTTP_HOST)")
    parser.add_argument("--cluster", default=_env("TRAINYARD_CLUSTER", "default"),
                        help="cluster name carried in subjects and KV keys (env TRAINYARD_CLUSTER)")
    parser.add_argument("--log-level", default=_env("TRAINYARD_LOG_LEVEL", "info"),
                        choices=["debug", "info", "warning", "error"],
                        help="log level (env TRAINYARD_LOG_LEVEL)")
    parser.add_argument("--shutdown-grace", default=_env("TRAINYARD_SHUTDOWN_GRACE", "10"),
                        help="seconds to finish in-flight work on SIGTERM (env TRAINYARD_SHUTDOWN_GRACE)")
    parser.add_argument("--ack-wait", default=_env("TRAINYARD_ACK_WAIT", "30"),
                        help="seconds before a message taken by a crashed or stuck replica is "
                             "delivered again (env TRAINYARD_ACK_WAIT)")


def config_from_args(service: str, args: argparse.Namespace) -> ServiceConfig:
    """Validates the common flags; a bad value raises UserError naming the flag."""

    port = _parse_number(args.http_port, "--http-port", int)
    if not 0 <= port <= 65535:
        raise UserError(f"--http-port: must be between 0 and 65535, got {port}")
    grace = _parse_number(args.shutdown_grace, "--shutdown-grace", float)
    if grace < 0:
        raise UserError("--shutdown-grace: must be greater than or equal to 0")
    ack_wait = _parse_number(getattr(args, "ack_wait", 30), "--ack-wait", float)
    if ack_wait <= 0:
        raise UserError("--ack-wait: must be greater than 0")
    if not str(args.nats_url).startswith(("nats://", "tls://", "ws://", "wss://")):
        raise UserError(f"--nats-url: expected a nats:// URL, got {args.nats_url!r}")
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        raise UserError(f"--kubeconfig: file not found: {args.kubeconfig}")
    if not args.cluster:
        raise UserError("--cluster: must not be empty")
    return ServiceConfig(
        service=service,
        kubeconfig=args.kubeconfig,
        nats_url=args.nats_url,
        http_host=args.http_host,
        http_port=port,
        cluster=args.cluster,
        log_level=args.log_level,
        shutdown_grace_s=grace,
        ack_wait_s=ack_wait,
        context=getattr(args, "context", None) or None,
    )


def _parse_number(value: object, flag: str, kind: type):

    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag}: expected a number, got {value!r}") from None


def seconds_flag(value: object, flag: str, *, zero_allowed: bool = False) -> float:
    """A duration flag in seconds: a clear error naming ``flag`` for anything else, and for a
    value below 0 (or at 0, unless ``zero_allowed``)."""
    try:
        seconds = float(str(value))
    except ValueError:
        raise UserError(f"{flag}: expected seconds, got {value!r}") from None
    if zero_allowed and seconds < 0:
        raise UserError(f"{flag}: must be 0 or more, got {value!r}")
    if not zero_allowed and seconds <= 0:
        raise UserError(f"{flag}: must be greater than 0")
    return seconds


def port_or_off(value: object, flag: str) -> int | None:
    """A port flag that also takes ``off`` (None): a clear error naming ``flag`` otherwise."""

    if str(value).lower() == "off":
        return None
    try:
        port = int(str(value))
    except ValueError:
        raise UserError(f"{flag}: expected a port number or 'off', got {value!r}") from None
    if not 0 <= port <= 65535:
        raise UserError(f"{flag}: must be between 0 and 65535, got {port}")
    return port


def run_service(config: ServiceConfig, main: Callable[[asyncio.Event], Awaitable[None]]) -> NoReturn:
    """Runs ``main(stop)`` with logging and tracing set up; SIGTERM/SIGINT set ``stop``; then
    ends the process with its exit status (``trainyard.eventloop.exit_process``).

    ``main`` should return once it has finished or handed back its in-flight work.
    """
    from trainyard.eventloop import exit_process

    exit_process(_run_to_the_end(config, main))


def _run_to_the_end(config: ServiceConfig, main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    from trainyard.telemetry.logging import configure_logging
    from trainyard.telemetry.tracing import configure_tracing

    configure_logging(config.service, config.log_level)
    provider = configure_tracing(config.service)

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    from trainyard.bus.connection import ServerTooOld
    from trainyard.eventloop import run
    from trainyard.kube.kubeconfig import KubeconfigError

    try:
        run(wrapper())
    except ServerTooOld as err:  # the bus cannot work with this server: one line, no retry
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except KubeconfigError as err:  # no cluster to talk to: one line, as for a bad flag
        log.error("no usable cluster configuration: %s", describe(err))
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except Exception:
        log.exception("service stopped on an unexpected error")
        return 1
    finally:
        provider.shutdown()
        sys.stderr.flush()
    return 0
