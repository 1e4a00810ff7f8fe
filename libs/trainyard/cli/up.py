"""`trainyard up`: the whole local stack in one command (NATS, devcluster, runtimes, services)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from trainyard.errors import UserError

HELP = "Start a local trainyard: embedded NATS, devcluster, CRDs and runtimes, and the four services."


def configure(parser: argparse.ArgumentParser) -> None:
    from trainyard.supervisor.layout import DATA_DIR_ENV, default_data_dir
    from trainyard.supervisor.ports import (
        DEFAULT_API_PORT,
        DEFAULT_NATS_PORT,
        DEFAULT_SERVICES_PORT,
        DEFAULT_WEBHOOK_PORT,
        DEFAULT_DASHBOARD_PORT,
    )

    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"where everything is kept; a second `up` on it resumes (default: ${DATA_DIR_ENV} "
                             f"or {default_data_dir()})")
    parser.add_argument("--nats-port", type=int, default=DEFAULT_NATS_PORT,
                        help=f"NATS client port (default {DEFAULT_NATS_PORT}; 0: a free port)")
    parser.add_argument("--api-port", type=int, default=DEFAULT_API_PORT,
                        help=f"devcluster API server port (default {DEFAULT_API_PORT}; 0: a free port)")
    parser.add_argument("--services-port", type=int, default=DEFAULT_SERVICES_PORT,
                        help=f"first of four HTTP ports (health, metrics) for watcher, planner, applier, status "
                             f"(default {DEFAULT_SERVICES_PORT}; 0: free ports)")
    parser.add_argument("--webhook-port", type=int, default=DEFAULT_WEBHOOK_PORT,
                        help=f"planner's admission webhook port (default {DEFAULT_WEBHOOK_PORT}; 0: a free port)")
    parser.add_argument("--planner-replicas", type=int, default=2,
                        help="planner processes per cluster (default 2); their webhooks sit behind one Service, "
                             "so the API server calls a live one while another restarts")
    parser.add_argument("--api-workers", type=int, default=0, metavar="N",
                        help="devcluster API worker processes behind its one HTTPS port, over one store process "
                             "(default 0: devcluster's choice from the cores, 1 process up to 4 cores)")
    parser.add_argument("--dashboard-port", type=int, default=DEFAULT_DASHBOARD_PORT,
                        help=f"port of the live web dashboard (default {DEFAULT_DASHBOARD_PORT}; 0: a free port; "
                             f"--skip dashboard: none)")
    parser.add_argument("--free-ports", action="store_true",
                        help="pick free ports for everything (same as setting every port option to 0)")
    parser.add_argument("--skip", action="append", default=[], metavar="COMPONENT",
                        help="do not start this component (nats, devcluster, watcher, planner, applier, status), "
                             "e.g. to run it yourself in a debugger; repeatable")
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="export every service's traces over OTLP/HTTP to this receiver, e.g. "
                             "http://127.0.0.1:4318 (sets OTEL_EXPORTER_OTLP_ENDPOINT for the services; "
                             "the other OTEL_* variables are passed through as they are)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="also start N worker clusters (worker-1..worker-N: a devcluster and the four "
                             "services each, on the same NATS) and the dispatcher on the manager, which runs "
                             "TrainJobs with spec.managedBy kueue.x-k8s.io/multikueue on them (default 0)")
    parser.add_argument("--worker-lost-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="with --workers: how long a worker may be unreachable before its TrainJobs are "
                             "dispatched to another (default 900, as Kueue's MultiKueue)")
    parser.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                        help="run NATS as a JetStream cluster of N nodes (1 or odd; default 1); with more "
                             "than one, streams and buckets get min(N, 3) replicas ($TRAINYARD_BUS_REPLICAS)")
    parser.add_argument("--merge-kubeconfig", action="store_true",
                        help="add this stack as a context (trainyard-<data dir>-<hash>, made current) to "
                             "$KUBECONFIG's first file or ~/.kube/config, as kind does; `down` removes it")
    parser.add_argument("--no-trainjob-status", action="store_true",
                        help="turn the TrainJobStatus feature gate off (upstream's default): trainer pods then get "
                             "no status endpoint to report progress to")
    parser.add_argument("--trainer-compat", default="v2.3", metavar="LEVEL",
                        help="upstream Kubeflow Trainer behaviour where v2.1.0 and v2.3.0 differ: v2.3 (default) or "
                             "v2.1, for clusters that pin v2.1 (planners, webhooks and status service; "
                             "docs/compatibility.md)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long each component may take to become ready (default 120)")


def _shortest(path: Path) -> str:
    """Relative to the current directory when below it (copy-paste friendly), else absolute."""
    cwd = Path.cwd()
    return os.path.relpath(path, cwd) if path.is_relative_to(cwd) else str(path)


def _try_this(kubeconfig: Path) -> list[str]:
    from trainyard.supervisor.binaries import MissingBinaryError, kubectl_binary
    from trainyard.packaged import examples_dir

    try:
        kubectl = _shortest(kubectl_binary())
    except MissingBinaryError:
        kubectl = "kubectl"
    example = _shortest(examples_dir() / "torch-ddp-cpu")
    base = f"{shlex.quote(kubectl)} --kubeconfig {shlex.quote(str(kubeconfig))}"
    return [f"{base} get clustertrainingruntimes", f"{base} apply -k {shlex.quote(example)}/"]


def run(args: argparse.Namespace) -> int:
    from trainyard.supervisor.binaries import MissingBinaryError
    from trainyard.supervisor.layout import default_data_dir
    from trainyard.supervisor.manifests import ManifestError
    from trainyard.supervisor.ports import PortInUseError
    from trainyard.supervisor.stack import Stack, StackConfig, StackError, run_stack

    from trainyard.compat import compat_from_args

    compat = compat_from_args(args, UserError)
    ports = (0, 0, 0, 0) if args.free_ports else (args.nats_port, args.api_port, args.services_port, args.webhook_port)
    config = StackConfig(
        data_dir=(args.data_dir or default_data_dir()).expanduser().resolve(),
        nats_port=ports[0], api_port=ports[1], services_port=ports[2], webhook_port=ports[3],
        skip=frozenset(args.skip), startup_timeout_s=args.startup_timeout,
        dashboard_port=0 if args.free_ports else args.dashboard_port,
        workers=args.workers, worker_lost_timeout_s=args.worker_lost_timeout,
        nats_cluster=args.nats_cluster, trainjob_status=not args.no_trainjob_status,
        planner_replicas=args.planner_replicas, trainer_compat=compat, api_workers=args.api_workers,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    def on_ready(stack: Stack) -> None:
        kubeconfig = stack.layout.kubeconfig
        say("")
        if "devcluster" in config.skip:
            say("trainyard is up (without devcluster).")
        else:
            say(f"trainyard is up. kubeconfig: {kubeconfig}")
            say("Try this:")
            for line in _try_this(kubeconfig):
                say(f"  {line}")
        for worker in stack.workers:
            say(f"Worker {worker.name}: kubeconfig {worker.kubeconfig}")
        if stack.workers:
            say("TrainJobs with spec.managedBy: kueue.x-k8s.io/multikueue on the manager run on the workers.")
        if args.merge_kubeconfig and "devcluster" not in config.skip:
            from trainyard.supervisor.userkube import merge_into_user_kubeconfig

            try:
                merged = merge_into_user_kubeconfig(kubeconfig, stack.layout.root)
            except (OSError, ValueError) as err:  # an unreadable or malformed user kubeconfig
                say(f"--merge-kubeconfig: not merged ({err}); use --kubeconfig {kubeconfig}")
            else:
                say(f"Context {merged.name} added to {merged.path} and made current "
                    "(removed again by `trainyard down`).")
        if stack.state is not None and stack.state.dashboard_url:
            say(f"Dashboard: {stack.state.dashboard_url}")
        say(f"Logs in {stack.layout.logs_dir}. Stop with Ctrl-C or `trainyard down --data-dir {stack.layout.root}`.")

    if args.nats_cluster > 1:
        from trainyard.bus.topology import REPLICAS_ENV, replicas_for_nodes

        os.environ.setdefault(REPLICAS_ENV, str(replicas_for_nodes(args.nats_cluster)))  # inherited by the services
    if args.otlp_endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.otlp_endpoint  # inherited by every child
    resuming = (config.data_dir / "stack.json").is_file()
    say(f"trainyard: {'resuming' if resuming else 'starting'} in {config.data_dir}"
        + (" (NATS streams and API objects kept)" if resuming else ""))
    try:
        return run_stack(config, say, on_ready)
    except (StackError, PortInUseError, MissingBinaryError, ManifestError, ValueError) as err:
        raise UserError(str(err), exit_code=1) from None
    finally:
        from trainyard.supervisor.userkube import remove_from_user_kubeconfig

        try:
            if remove_from_user_kubeconfig(config.data_dir) is not None:
                say("Context removed from the user's kubeconfig.")
        except (OSError, ValueError) as err:
            say(f"--merge-kubeconfig: could not remove the context: {err}")
        sys.stdout.flush()
