"""Run the data plane alone against any devcluster: ``python -m trainyard_services.devcluster.dataplane``.

``trainyard devcluster up`` starts the same code inside the API server process; this entry is
for tests and for running the data plane next to a server started with ``--no-dataplane``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from .admission import parse_feature_gates
from .kubelet import machine_capacity
from .plane import DataPlaneOptions, run_dataplane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainyard_services.devcluster.dataplane",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="the devcluster data dir (pod logs go to <data-dir>/pods)")
    parser.add_argument("--node-name", default="devcluster")
    parser.add_argument("--time-scale", type=float, default=0.1,
                        help="factor on Kubernetes back-off delays (default 0.1)")
    parser.add_argument("--shared-network", action="store_true",
                        help="no network namespaces: every pod uses the host network")
    parser.add_argument("--capacity", action="append", default=[], metavar="NAME=QUANTITY",
                        help="override the node's capacity, e.g. cpu=4 (repeatable)")
    parser.add_argument("--jobset-feature-gates", default="", metavar="NAME=BOOL,...",
                        help="JobSet feature gates, as JobSet's --feature-gates (e.g. ElasticJobSet=true; default off)")
    args = parser.parse_args(argv)
    if not args.kubeconfig.is_file():
        print(f"error: --kubeconfig: {args.kubeconfig} is not a file", file=sys.stderr)
        return 2
    try:
        gates = parse_feature_gates(args.jobset_feature_gates)
    except ValueError as err:
        print(f"error: --jobset-feature-gates: {err}", file=sys.stderr)
        return 2
    capacity = None
    if args.capacity:
        capacity = machine_capacity(0)
        for item in args.capacity:
            name, sep, value = item.partition("=")
            if not sep or not name or not value:
                print(f"error: --capacity: {item!r} is not NAME=QUANTITY", file=sys.stderr)
                return 2
            capacity[name] = value
    logging.basicConfig(level=logging.INFO, format='{"level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}')
    options = DataPlaneOptions(kubeconfig=args.kubeconfig, data_dir=args.data_dir,
                               node_name=args.node_name, time_scale=args.time_scale,
                               isolate=not args.shared_network, capacity=capacity, jobset_feature_gates=gates,
                               announce=lambda line: print(line, flush=True))

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_dataplane(options, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
