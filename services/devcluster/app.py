"""Process wiring of ``trainyard devcluster up``: logging, signals, kubeconfig, ready line."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path

from trainyard.errors import UserError


def run_up(data_dir: Path, host: str, port: int, watch_history: int, log_level: str,
           dataplane: bool = False, authorization_mode: str = "RBAC",
           jobset_feature_gates: frozenset[str] = frozenset(), audit_log_path: str | None = None,
           api_workers: int = 1) -> int:
    from trainyard.telemetry.logging import configure_logging
    from trainyard_services.devcluster.process.supervisor import WorkerFailed
    from trainyard_services.devcluster.storage.store import DataDirError
    from trainyard.eventloop import run
    configure_logging("devcluster", log_level)
    try:
        run(_main(data_dir, host, port, watch_history, dataplane, authorization_mode,
                          jobset_feature_gates=jobset_feature_gates, audit_log_path=audit_log_path,
                          api_workers=api_workers, log_level=log_level))
    except DataDirError as err:
        raise UserError(f"--data-dir: {err}") from None
    except WorkerFailed as err:  # the other workers and the store are stopped by now
        logging.getLogger("trainyard.devcluster").error("devcluster stopped: %s", err)
        return 1
    except OSError as err:
        if err.errno in (98, 48):  # address in use
            raise UserError(f"--port: {host}:{port} is already in use (choose another port or --port 0)") from None
        raise
    return 0


async def _main(data_dir: Path, host: str, port: int, watch_history: int, dataplane: bool = False,
                authorization_mode: str = "RBAC", jobset_feature_gates: frozenset[str] = frozenset(),
                audit_log_path: str | None = None, api_workers: int = 1, log_level: str = "INFO") -> None:
    from trainyard_services.devcluster.apiserver.server import serve
    from .tls import ensure_credentials, kubeconfig_text

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready_file = data_dir / "ready"
    dataplane_task: asyncio.Task | None = None

    def on_ready(url: str, bound_port: int) -> None:
        kubeconfig = data_dir / "kubeconfig"
        kubeconfig.write_text(kubeconfig_text(url, ensure_credentials(data_dir)))
        kubeconfig.chmod(0o600)
        line = {"event": "ready", "url": url, "port": bound_port, "kubeconfig": str(kubeconfig),
                "data_dir": str(data_dir)}
        ready_file.write_text(json.dumps(line) + "\n")
        print(f"devcluster API server listening on {url}", flush=True)
        print(f"  export KUBECONFIG={kubeconfig}", flush=True)
        print("  kubectl get namespaces", flush=True)
        print(json.dumps(line), flush=True)
        if dataplane:
            nonlocal dataplane_task
            from .dataplane.plane import start_embedded
            # The data plane acts as its own identity (authn.CONTROLLERS), not as the admin user.
            dataplane_task = start_embedded(data_dir, _controllers_kubeconfig(data_dir, url), stop,
                                            jobset_feature_gates)

    # Shutdown order: the data plane winds down first (it stops every pod and cleans up through
    # the API), then the API server stops.
    server_stop = asyncio.Event()

    async def wait_dataplane() -> None:
        if dataplane_task is None:
            return
        try:
            await dataplane_task
        except Exception:  # noqa: BLE001 - reported, the API server still stops cleanly
            logging.getLogger("trainyard.devcluster").exception("data plane stopped with an error")

    async def stop_in_order() -> None:
        await stop.wait()
        await wait_dataplane()
        server_stop.set()

    stopper = asyncio.create_task(stop_in_order())
    try:
        if api_workers > 1:
            from trainyard_services.devcluster.process.supervisor import WorkerSettings, run_workers
            settings = WorkerSettings(host, port, api_workers, watch_history, authorization_mode, audit_log_path,
                                      log_level)
            await run_workers(data_dir, settings, on_ready, server_stop, stop)
        else:
            await serve(data_dir, host=host, port=port, history_size=watch_history, on_ready=on_ready,
                        stop=server_stop, authorization_mode=authorization_mode, audit_log_path=audit_log_path)
    finally:
        stopper.cancel()
        stop.set()
        await wait_dataplane()
        ready_file.unlink(missing_ok=True)


def _controllers_kubeconfig(data_dir: Path, url: str) -> Path:
    """``pki/controllers.kubeconfig`` (0600): the in-process data plane's credentials."""
    import dataclasses

    from trainyard_services.devcluster.apiserver.filters.authentication import CONTROLLERS_KUBECONFIG, ensure_controllers_token
    from .tls import ensure_credentials, kubeconfig_text

    credentials = dataclasses.replace(ensure_credentials(data_dir), token=ensure_controllers_token(data_dir))
    path = data_dir / "pki" / CONTROLLERS_KUBECONFIG
    path.write_text(kubeconfig_text(url, credentials))
    path.chmod(0o600)
    return path
