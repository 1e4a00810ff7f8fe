"""An API worker process: ``python -m trainyard_services.devcluster.process.worker``.

Started by the store process (``supervisor.py``), never by hand. It serves HTTPS on the
devcluster's port beside the other workers (SO_REUSEPORT) with the whole request path — TLS,
decoding, authentication, RBAC, admission, strategies, schema and CEL, server-side apply, the
garbage collector and namespace controller of its own writes, watches — over a ``Replica``
of the store, and commits to the store process. It exits when the store process goes (its
stream ends) or on SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Callable

from trainyard import eventloop
from ..apiserver.registry.kinds import Registry
from ..apiserver.server import ApiServer, serve
from ..storage.store import Change
from ..tls import ensure_credentials
from ..storage.replica import Replica

log = logging.getLogger("trainyard.devcluster.worker")
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")


def follow_crds(registry: Registry) -> Callable[[Change], None]:
    """Keep the registry's custom resource types in step with the stream: a CRD written through
    any worker is served by all."""
    def on_change(change: Change) -> None:
        if change.key != CRD_KEY:
            return
        if change.type == "DELETED":
            registry.remove_crd(change.name)
        else:
            registry.install_crd(json.loads(change.raw))
    return on_change


async def run(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    replica = Replica(data_dir, Path(args.socket), history_size=args.watch_history)
    await replica.connect()
    server = ApiServer(data_dir, ensure_credentials(data_dir), history_size=args.watch_history,
                       authorization_mode=args.authorization_mode, store=replica)
    replica.on_change.append(follow_crds(server.registry))
    server.api.strategies.share_allocators(args.index, args.count)

    async def ready(url: str, port: int) -> None:
        await replica.announce_ready(os.getpid())

    async def until_stopped() -> None:
        done = asyncio.ensure_future(replica.closed.wait())
        asked = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, asked}, return_when=asyncio.FIRST_COMPLETED)
        for task in (done, asked):
            task.cancel()
        stop.set()

    watcher = asyncio.create_task(until_stopped())
    try:
        await serve(data_dir, host=args.host, port=args.port, history_size=args.watch_history, on_ready=ready,
                    stop=stop, authorization_mode=args.authorization_mode,
                    audit_log_path=args.audit_log_path or None, server=server, reuse_port=True)
    finally:
        watcher.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--watch-history", type=int, default=4096)
    parser.add_argument("--authorization-mode", default="RBAC")
    parser.add_argument("--audit-log-path", default="")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--index", type=int, required=True, help="this worker's number, from 0")
    parser.add_argument("--count", type=int, required=True, help="the number of API workers")
    args = parser.parse_args()
    from trainyard.telemetry.logging import configure_logging
    configure_logging("devcluster", args.log_level)
    eventloop.run(run(args))


if __name__ == "__main__":
    main()
