"""Multi-cluster soak: the delegation design's guarantees under faults, at size.

Starts `trainyard up --workers 2 --nats-cluster 3` (a manager and two worker devclusters with
their services, the dispatcher, a 3-node JetStream cluster), submits N delegated TrainJobs to
the manager (every 20th suspended; the rest run a container that exits 0) and updates a label
on each, while services of every cluster, NATS nodes and one worker's devcluster (its whole
process group, held down past the lost timeout) are SIGKILLed; the supervisor restarts them.
Then checks, per TrainJob the manager accepted: not lost, labels kept, Complete (or Suspended)
on the manager, on exactly one worker that the manager points at, its status mirrored, no stale
copy on the other worker, nothing dead-lettered, and 0 API errors seen by the submitting client.
Faults and checks: tests/fixtures/soak.py.

Usage: .venv/bin/python bench/soak.py [--trainjobs 1000] [--kill-interval 3] [--nats-kills 1]
           [--lost-timeout 6] [--budget SECONDS] [--seed 0] [--keep]
Prints the figures (TrainJobs, kills by target, convergence time, errors, load) and a JSON line;
exits 0 when every guarantee held, 1 when one did not, 2 when a wait ran out of budget.
Every wait is bounded; every process it started is stopped by pid at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.soak import Soak, SoakConfig, SoakError  # noqa: E402
from fixtures.stack import start_stack  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=1000, help="delegated TrainJobs to submit (default 1000)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight from the client")
    parser.add_argument("--kill-interval", type=float, default=3.0, help="mean seconds between SIGKILLs")
    parser.add_argument("--nats-kills", type=int, default=1, help="NATS nodes killed, one at a time")
    parser.add_argument("--no-worker-outage", action="store_true", help="do not kill a worker's devcluster")
    parser.add_argument("--lost-timeout", type=float, default=6.0, help="the dispatcher's --worker-lost-timeout")
    parser.add_argument("--min-chaos", type=float, default=60.0, help="seconds of faults at least")
    parser.add_argument("--budget", type=float, default=0, help="seconds for convergence (default 120 + 1 per TrainJob)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs) afterwards")
    args = parser.parse_args()
    if args.trainjobs < 1:
        parser.error("--trainjobs: must be 1 or more")
    config = SoakConfig(trainjobs=args.trainjobs, concurrency=args.concurrency, kill_interval_s=args.kill_interval,
                        nats_kills=args.nats_kills, worker_outage=not args.no_worker_outage,
                        lost_timeout_s=args.lost_timeout, min_chaos_s=args.min_chaos,
                        converge_budget_s=args.budget or 120 + args.trainjobs, seed=args.seed)
    # SIGTERM unwinds like Ctrl-C, so the stack is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="trainyard-soak-"))
    began = time.monotonic()
    print(f"starting trainyard up --workers 2 --nats-cluster 3 --worker-lost-timeout {args.lost_timeout:g} "
          f"in {work} (budget 300s)", flush=True)
    try:
        stack = start_stack(work / "data", "--workers", "2", "--nats-cluster", "3",
                            "--worker-lost-timeout", f"{args.lost_timeout:g}", timeout=300)
    except AssertionError as err:
        print(f"error: the stack did not start: {str(err)[-2000:]}", file=sys.stderr)
        return 2
    print(f"stack ready in {time.monotonic() - began:.1f}s", flush=True)
    soak = Soak(stack, config, say=lambda line: print(line, flush=True))
    code = 0
    try:
        report = asyncio.run(soak.run())
    except SoakError as err:
        report = soak.report
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        report = soak.report
        print("interrupted: stopping the stack", file=sys.stderr)
        code = 130
    finally:
        load = os.getloadavg()
        down = stack.stop()
        stack.kill()
        survivors = stack.survivors()
        if down.returncode != 0 or survivors:
            print(f"warning: trainyard down exited {down.returncode} ({down.stderr.strip()[-300:]}); "
                  f"processes still alive: {survivors}", file=sys.stderr)
    kills = dict(sorted(report.kills.items()))
    print(f"TrainJobs: {report.accepted} accepted of {config.trainjobs} "
          f"(every {config.suspended_every}th suspended), labels updated on each; states {dict(report.states)}")
    print(f"kills: {sum(kills.values())} SIGKILLs over {report.chaos_s:.0f}s: {kills}")
    print(f"worker outage: {report.outage_worker or 'none'} (devcluster process group, held past the "
          f"{args.lost_timeout:g}s lost timeout); WorkerLost re-dispatches: {report.redispatched}")
    print(f"restarts by the supervisor: {report.restarts}")
    if report.converged_after_s is not None:
        print(f"converged: {report.converged_after_s:.1f}s after the first create "
              f"({report.converged_after_last_kill_s:.1f}s after the last kill; submission took {report.submit_s:.1f}s); "
              f"current copies per worker {dict(report.copies)}")
    print(f"client-visible errors on the manager: {len(report.errors)}"
          + "".join(f"\n  {line}" for line in report.errors[:20]))
    print(f"dead-lettered messages: {report.dead_letters}"
          + "".join(f"\n  {line}" for line in report.dead_letter_lines[:20]))
    if report.violations:
        print(f"violations: {len(report.violations)}" + "".join(f"\n  {line}" for line in report.violations[:30]))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in load)}")
    print(json.dumps({"trainjobs": report.accepted, "kills": kills, "redispatched": report.redispatched,
                      "converged_s": report.converged_after_s and round(report.converged_after_s, 1),
                      "after_last_kill_s": report.converged_after_last_kill_s
                      and round(report.converged_after_last_kill_s, 1),
                      "errors": len(report.errors), "violations": len(report.violations),
                      "dead_letters": report.dead_letters, "load": [round(x, 2) for x in load]}))
    if args.keep:
        print(f"data and logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if code == 0 and not report.ok:
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
