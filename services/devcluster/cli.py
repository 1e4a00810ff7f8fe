"""``trainyard devcluster up``: run the embedded Kubernetes-compatible API server in the foreground."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from trainyard.errors import UserError

HELP = "Run the embedded devcluster (Kubernetes-compatible API server) in the foreground."
DEFAULT_PORT = 26443


def default_data_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "trainyard" / "devcluster"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="devcluster_command", metavar="ACTION")
    up = sub.add_parser("up", help="start the API server (foreground); writes <data-dir>/kubeconfig")
    up.add_argument("--data-dir", type=Path, default=None,
                    help=f"state directory (default: {default_data_dir()})")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTPS port (default {DEFAULT_PORT}; 0 picks a free one)")
    up.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    up.add_argument("--watch-history", type=int, default=4096,
                    help="changes kept for watches; older resourceVersions get 410 Expired (default 4096)")
    up.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    up.add_argument("--dataplane", action=argparse.BooleanOptionalAction, default=True,
                    help="run the data plane (JobSet/Job controllers, scheduler, pod runner; default on)")
    up.add_argument("--jobset-feature-gates", default="", metavar="NAME=BOOL,...",
                    help="JobSet feature gates of the data plane, as JobSet's --feature-gates "
                         "(e.g. ElasticJobSet=true; all alpha gates off by default)")
    up.add_argument("--authorization-mode", default="RBAC", choices=["RBAC", "AlwaysAllow"],
                    help="RBAC (default): every request is checked against Roles/ClusterRoles and their "
                         "bindings; AlwaysAllow: any authenticated request is allowed")
    up.add_argument("--api-workers", type=int, default=0, metavar="N",
                    help="API worker processes on the one HTTPS port (SO_REUSEPORT), each doing TLS, authn/authz, "
                         "admission, schema/CEL and server-side apply, over one store process that owns "
                         "resourceVersions, the watch history and SQLite (default 0: from the cores; 1 process up "
                         "to 4 cores, else half the cores, at most 8; 1: today's single process)")
    up.add_argument("--audit-log-path", default=None, metavar="PATH",
                    help="write an audit.k8s.io/v1 Event (level Metadata) per authenticated request to PATH "
                         "as JSON lines, with admission's audit annotations ('-': stdout; default: no audit log)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "devcluster_command", None) != "up":
        raise UserError("devcluster: choose an action, e.g. `trainyard devcluster up`")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port: {args.port} is not a TCP port (0-65535)")
    if args.api_workers < 0 or args.api_workers > 64:
        raise UserError(f"--api-workers: must be between 0 (from the cores) and 64, got {args.api_workers}")
    if args.watch_history < 1:
        raise UserError("--watch-history: must be at least 1")
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    audit_log = args.audit_log_path
    if audit_log is not None and audit_log != "-":
        audit_path = Path(audit_log).expanduser().resolve()
        if audit_path.is_dir() or not audit_path.parent.is_dir():
            raise UserError(f"--audit-log-path: {audit_log} is not a file in an existing directory")
        audit_log = str(audit_path)
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data-dir: {data_dir} exists and is not a directory")
    from trainyard_services.devcluster.dataplane.admission import parse_feature_gates
    try:
        gates = parse_feature_gates(args.jobset_feature_gates)
    except ValueError as err:
        raise UserError(f"--jobset-feature-gates: {err}") from None
    from trainyard_services.devcluster.app import run_up
    from trainyard_services.devcluster.process.supervisor import default_api_workers
    return run_up(data_dir, args.host, args.port, args.watch_history, args.log_level,
                  dataplane=args.dataplane, authorization_mode=args.authorization_mode,
                  jobset_feature_gates=gates, audit_log_path=audit_log,
                  api_workers=args.api_workers or default_api_workers())
