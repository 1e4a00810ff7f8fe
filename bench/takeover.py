"""Takeover benchmark: one of N replicas of a role SIGKILLed, then one SIGTERMed, mid-burst.

Starts bench/e2e.py's stack with ``--replicas`` replicas of ``--role`` (the other services one
each), then for each signal (SIGKILL, then SIGTERM: a crash, then a graceful scale-down):
1. creates ``--burst`` TrainJobs as fast as the API server takes them (``--generators``);
2. once ``--kill-after`` of their JobSets exist, sends the signal to one replica of the role;
3. measures the seconds from the signal until every partition is leased again by the live
   replicas (docs/bus.md, "Partitions and home replicas": a replica serves a partition from the
   moment its lease is written), whether every TrainJob of the burst got its JobSet (lost),
   plans applied more than once (``TY_RESULTS``: outcome ``applied`` twice for one TrainJob,
   generation and plan), and the messages the surviving replicas received again
   (``trainyard_redelivered_messages_total``: what the stopped replica had fetched and not
   acknowledged comes back; after a crash, once the ack wait ran out);
4. starts a new replica and measures until the partitions are spread over N replicas again.

With ``--cpu-limit CORES`` each replica of ``--limit-roles`` (default planner, applier, status)
runs in a cgroup of its own with that CPU quota (bench/cpu_quota.py, as bench/e2e.py): lifted
while it starts (the new replica of step 4 too), applied once it is ready; each phase then also
prints every limited replica's CPU as a share of its limit from the burst's start to the signal
and from the signal to the last apply result, and which were at their limit.

Usage: .venv/bin/python bench/takeover.py [--role applier] [--replicas 4] [--burst 600]
       [--kill-after 150] [--ack-wait 5] [--cpu-limit CORES [--limit-roles planner,applier,status]]
Prints figures (targets, issue #23: served again within 5 s of a SIGKILL, 0 lost, 0 applied
twice; a graceful stop causes no redelivery storm); asserts nothing; every wait has a budget.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from cpu_quota import add_arguments as add_limit_arguments, limit_lines, parse_limit  # noqa: E402
from e2e import (RUNTIME, SERVICES, TRAINJOBS, Generators, JobSetWatch, Stack, loadavg,  # noqa: E402
                 parse_replicas, prometheus_samples, start_service, wait_balanced, wait_ready)
from waiting import GaveUp, missing, wait_until  # noqa: E402

NS = "takeover"
ROLES = ("planner", "applier", "status")


async def lease_holders(js, role: str) -> dict[int, str]:
    """Partition -> the replica whose lease names it, for ``role``."""
    from trainyard.bus.topology import LEASES_BUCKET

    kv = await js.key_value(LEASES_BUCKET)
    try:
        keys = await kv.keys()
    except Exception:  # no keys at all
        return {}
    held = {}
    for key in keys:
        parts = key.split(".")
        if len(parts) == 4 and parts[0] == role and parts[2] == "p" and parts[3].isdigit():
            try:
                held[int(parts[3])] = (await kv.get(key)).value.decode()
            except Exception:  # released between the listing and the read
                continue
    return held


def redelivered(ports: list[int]) -> float:
    """Messages received again, summed over the replicas behind ``ports``."""
    total = 0.0
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        samples = prometheus_samples(text, "trainyard_redelivered_messages_total")
        if not samples:
            raise SystemExit(f"error: the replica on port {port} has no trainyard_redelivered_messages_total")
        total += sum(samples.values())
    return total


class ApplyResults:
    """The apply results of TY_RESULTS for the TrainJobs of one namespace, read as they arrive
    through one ephemeral consumer: how often each plan (TrainJob, generation, plan) was
    applied, the TrainJobs with a result (any outcome: a plan the stopped replica applied but
    had not reported comes back to a survivor as ``skipped-unchanged``) and the outcomes."""

    def __init__(self, js, namespace: str) -> None:
        self._js, self.namespace = js, namespace
        self.applied: Counter = Counter()
        self.outcomes: Counter = Counter()
        self.names: set[str] = set()
        self._sub = None

    async def read_new(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        from trainyard.bus.envelopes import ApplyResult, decode
        from trainyard.bus.topology import RESULTS_STREAM

        if self._sub is None:
            self._sub = await self._js.pull_subscribe(">", stream=RESULTS_STREAM, config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
        try:
            messages = await self._sub.fetch(500, timeout=0.5)
        except Exception:  # nothing new within the timeout
            return
        for msg in messages:  # without acks each message comes once to this consumer
            result = decode(ApplyResult, msg.data)
            if result.namespace != self.namespace:
                continue
            self.outcomes[result.outcome] += 1
            self.names.add(result.name)
            if result.outcome == "applied":
                self.applied[(result.uid, result.generation, result.plan_hash)] += 1

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()


async def with_status(client: httpx.AsyncClient, namespace: str, count: int, budget_s: float) -> int:
    """How many of the ``count`` TrainJobs of ``namespace`` have a status written (waiting up to
    ``budget_s`` for all of them)."""
    found = {"n": 0}

    async def all_written() -> bool:
        listed = (await client.get(TRAINJOBS.format(ns=namespace))).json().get("items") or []
        found["n"] = sum(1 for tj in listed if tj.get("status"))
        return found["n"] >= count

    try:
        await wait_until(f"a status on each of the {count} TrainJobs", all_written, budget_s,
                         progress=lambda: f"{found['n']}/{count}", poll_s=0.5)
    except GaveUp as err:
        print(f"  {err}", flush=True)
    return found["n"]


async def phase(stack: Stack, client: httpx.AsyncClient, watch: JobSetWatch, js, args, sig: signal.Signals,
                tag: str) -> None:
    role, cluster = args.role, stack.cluster
    # The role's last replica is stopped (its port is the role's last one in stack.ports).
    victim_index = max(index for index, (name, _) in enumerate(stack.procs) if name == role)
    victim = stack.procs[victim_index][1]
    victim_label = stack.label(role, args.replicas - 1)  # its cgroup's, with --cpu-limit
    survivors = stack.ports[role][:-1]
    namespace = f"{NS}-{tag}"
    names = [f"{tag}-{i}" for i in range(args.burst)]
    keys = [f"{namespace}/{n}" for n in names]
    creators = Generators(cluster, "create", namespace, names, args.generators, args.concurrency)
    await creators.start()
    limits_before = stack.limits.snapshot()
    began = time.perf_counter()
    creators.go()
    await wait_until(f"{args.kill_after} JobSets of the burst before the {sig.name}",
                     lambda: sum(1 for k in keys if k in watch.seen) >= args.kill_after, 300,
                     progress=lambda: missing(keys, watch.seen))
    before = await lease_holders(js, role)
    again_before = redelivered(survivors)
    limits_at_signal = stack.limits.snapshot()
    os.kill(victim.pid, sig)
    signalled = time.perf_counter()
    until_signal = stack.limits.shares(limits_before, signalled - began)
    limits_at_signal.pop(victim_label, None)  # stopped: the survivors and the other roles from here
    holders_before = set(before.values())
    after: dict[int, str] = {}

    async def served_again() -> bool:
        held = await lease_holders(js, role)
        alive = set(held.values())
        after.clear()
        after.update(held)  # the leases that ended the wait (a later read may fail on a busy bus)
        return len(held) == args.partitions and len(alive) == args.replicas - 1 and alive < holders_before

    taken = await wait_until(f"the {role} partitions leased by the {args.replicas - 1} live replicas", served_again,
                             60, poll_s=0.05)
    moved = sorted(p for p in after if before.get(p) != after[p])
    await creators.finish()
    try:
        await watch.wait_all(keys, timeout=args.budget)
    except GaveUp as err:
        print(f"  {err}", flush=True)
    created = sum(1 for k in keys if k in watch.seen)
    if role == "status":  # what a status replica does: every TrainJob gets its status written
        created = await with_status(client, namespace, len(names), args.budget)
    victim.wait(timeout=60)
    # A JobSet the stopped replica applied without acknowledging its plan exists already; its
    # plan comes back to a survivor after the ack wait: every TrainJob's result is awaited.
    results = ApplyResults(js, namespace)

    async def every_result() -> bool:
        await results.read_new()
        return len(results.names) >= created

    try:
        await wait_until(f"an apply result for each of the {created} TrainJobs", every_result,
                         args.ack_wait * 3 + 60, progress=lambda: f"{len(results.names)}/{created}", poll_s=0.0)
    except GaveUp as err:
        print(f"  {err}", flush=True)
    finally:
        await results.close()
    again = redelivered(survivors) - again_before
    after_signal = stack.limits.shares(limits_at_signal, time.perf_counter() - signalled)
    plans, twice = len(results.applied), sum(1 for n in results.applied.values() if n > 1)
    print(f"{sig.name} of 1 of {args.replicas} {role} replicas after {args.kill_after} of {args.burst} JobSets: "
          f"its {len(moved)} partitions ({', '.join(map(str, moved))}) leased by the survivors {taken:.2f} s after "
          f"the signal; {created}/{args.burst} {'with a status' if role == 'status' else 'JobSets'} "
          f"({args.burst - created} lost); "
          f"{twice} of {plans} plans applied more than once; {again:.0f} messages received again by the "
          f"survivors; load {loadavg()}", flush=True)
    unreported = results.outcomes.get("skipped-unchanged", 0)
    if unreported:
        print(f"  {unreported} results skipped-unchanged: a plan delivered again and found applied already (e.g. "
              "applied by the stopped replica before it sent its result); not applied twice", flush=True)
    for when, shares in (("from the burst's start to the signal", until_signal),
                         ("from the signal to the last apply result", after_signal)):
        for line in limit_lines(shares, args.cpu_limit):
            print(f"  {when}: {line}", flush=True)
    # Back to N replicas: a new one joins and takes a share.
    started = time.perf_counter()
    proc = start_service(role, cluster.kubeconfig, stack.nats_url, stack.workdir, replica=300 + victim_index)
    stack.procs[victim_index] = (role, proc)
    if role in args.limit_roles:  # its predecessor's cgroup, the limit lifted while it starts
        stack.limits.starting(victim_label, proc.pid)
    stack.ports[role][-1] = wait_ready(proc, role)
    await wait_balanced(stack.nats_url, stack.replicas)
    if role in args.limit_roles:
        stack.limits.apply(victim_label)
    print(f"  a new {role} replica joined: the partitions spread over {args.replicas} again "
          f"{time.perf_counter() - started:.1f} s after its start", flush=True)


async def run(stack: Stack, args) -> None:
    import nats

    cluster = stack.cluster
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    nc = await nats.connect(servers=stack.nats_url.split(","))
    try:
        async with httpx.AsyncClient(base_url=cluster.url, verify=context, timeout=60,
                                     headers={"Authorization": f"Bearer {cluster.token}"}) as client:
            (await client.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
             ).raise_for_status()
            for tag in ("k", "t"):
                await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": f"{NS}-{tag}"}})
            watch = JobSetWatch(client)
            await watch.start()
            for sig, tag in ((signal.SIGKILL, "k"), (signal.SIGTERM, "t")):
                await phase(stack, client, watch, nc.jetstream(), args, sig, tag)
            await watch.stop()
    finally:
        await nc.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``limit_roles`` a tuple of services)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="applier", choices=ROLES, help="the role one replica of which is stopped")
    parser.add_argument("--replicas", type=int, default=4, help="replicas of --role")
    parser.add_argument("--burst", type=int, default=600, help="TrainJobs created in each burst")
    parser.add_argument("--kill-after", type=int, default=150, help="JobSets of the burst before the signal")
    parser.add_argument("--generators", type=int, default=4, help="load-generating processes")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight, over all generators")
    parser.add_argument("--ack-wait", type=float, default=5.0, metavar="SECONDS",
                        help="the services' $TRAINYARD_ACK_WAIT: how long a crashed replica's fetched messages "
                             "wait before they are delivered again")
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="how long a burst's JobSets may take after the signal before the missing are lost")
    add_limit_arguments(parser, ",".join(ROLES), "the services whose replicas are limited")
    args = parser.parse_args(argv)
    args.limit_roles = parse_limit(args.cpu_limit, args.limit_roles, SERVICES)
    if args.replicas < 2:
        raise SystemExit("error: --replicas: needs at least 2 (one is stopped)")
    if not 0 < args.kill_after < args.burst:
        raise SystemExit("error: --kill-after: needs 0 < kill-after < burst")
    if args.generators < 1 or args.concurrency < args.generators:
        raise SystemExit("error: --generators needs >= 1 and --concurrency >= --generators")
    if args.ack_wait <= 0:
        raise SystemExit("error: --ack-wait: seconds, more than 0")
    return args


def main() -> int:
    args = parse_args()
    from trainyard.bus.subjects import partitions_setting

    args.partitions = partitions_setting()
    os.environ["TRAINYARD_ACK_WAIT"] = f"{args.ack_wait:g}"  # inherited by the services
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-takeover-"))
    with Stack(parse_replicas(f"{args.role}={args.replicas}"), workdir, cpu_limit=args.cpu_limit,
               limit_roles=args.limit_roles) as stack:
        limit = (f"; each replica of {', '.join(args.limit_roles)} limited to {args.cpu_limit:g} CPU "
                 f"({stack.limits.describe()})" if stack.limits else "")
        print(f"machine: {os.cpu_count()} CPUs, load {loadavg()}; {args.replicas} {args.role} replicas, "
              f"{args.partitions} partitions, ack wait {args.ack_wait:g} s{limit}; logs in {workdir}", flush=True)
        asyncio.run(run(stack, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
