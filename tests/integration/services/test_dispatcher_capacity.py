"""The dispatcher never places more on a worker than its capacity holds — found by the soak
(bench/soak.py), which saw 344 unfinished copies on a worker with room for 110 pods:

- a resync forgot the placements made while its TrainJob list was in flight (TrainJobs created
  after the list was taken are not in it), so during a burst every pass freed their capacity;
- after a restart, the dispatcher placed before it had counted the placements on record, and a
  copy mirrored before that count was recorded as requesting nothing;
- a runtime lookup that failed (a timeout under load) made the TrainJob request nothing;
- and placement waited for every stale copy of a worker back from an outage to be deleted
  (one DELETE at a time, hundreds of them), so nothing was placed for a minute.

Real API servers: a manager and a worker devcluster (no data plane: the worker's Node is
declared with room for two pods, and no pod ever starts, so only the dispatcher's count keeps
a third TrainJob out), and a real nats-server for the slots the dispatchers share (ty_slots).
The dispatcher runs in-process without event consumers; its triggers (events, resyncs, a
restart, a second replica) are called directly, in the order that broke.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fixtures.devcluster import start_devcluster

REPO = Path(__file__).resolve().parents[3]
MANAGED_BY = "kueue.x-k8s.io/multikueue"
WORKER = "worker-1"
WORKER_ANNOTATION = "trainyard.kubeflow.org/worker-cluster"

pytestmark = pytest.mark.slow

RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "one-pod"},
    "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
        "name": "node",
        "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {"containers": [
                         {"name": "node", "image": "busybox", "command": ["true"]}]}}}}}]}}},
}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "2"},
                   "capacity": {"cpu": "4", "memory": "8Gi", "pods": "2"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory, nats_server_module):
    root = tmp_path_factory.mktemp("dispatcher-capacity")
    manager = start_devcluster(root / "manager")
    try:
        worker = start_devcluster(root / "worker")
        try:
            crds = [arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))]
            for cluster in (manager, worker):
                cluster.kubectl("apply", "--server-side", *crds, timeout=120)
                cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
                cluster.kubectl("apply", "-f", "-", input=json.dumps(RUNTIME))
            worker.kubectl("create", "-f", "-", input=json.dumps(NODE))
            # The worker declared on the manager as `trainyard up --workers` declares it.
            manager.kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / "multicluster" / "crds"))
            manager.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            manager.kubectl("create", "secret", "generic", f"{WORKER}-kubeconfig", "-n", "kubeflow-system",
                            f"--from-file=kubeconfig={worker.kubeconfig}")
            manager.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster", "metadata": {"name": WORKER},
                "spec": {"kubeConfig": {"locationType": "Secret", "location": f"{WORKER}-kubeconfig"}}}))
            worker.kubectl("patch", "node", "node-1", "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": NODE["status"]}))
            yield manager, worker, nats_server_module
        finally:
            worker.stop()
    finally:
        manager.stop()


@pytest.fixture(scope="module")
def second_worker(tmp_path_factory, clusters):
    """worker-2 (its own API server, room for two pods), for the one test that moves a TrainJob."""
    worker = start_devcluster(tmp_path_factory.mktemp("dispatcher-capacity-2") / "worker-2")
    try:
        crds = [arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))]
        worker.kubectl("apply", "--server-side", *crds, timeout=120)
        worker.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        worker.kubectl("apply", "-f", "-", input=json.dumps(RUNTIME))
        worker.kubectl("create", "-f", "-", input=json.dumps(NODE))
        worker.kubectl("patch", "node", "node-1", "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": NODE["status"]}))
        yield worker
    finally:
        worker.stop()


def delegated(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"managedBy": MANAGED_BY, "runtimeRef": {"name": "one-pod"}}}


class Setup:
    """Clients of both clusters, a registry that knows the worker, and dispatchers on them."""

    def __init__(self, manager_kubeconfig: Path, worker_kubeconfig: Path, nats_url: str) -> None:
        self.paths = (manager_kubeconfig, worker_kubeconfig)
        self.nats_url = nats_url

    async def __aenter__(self):
        import nats

        from trainyard.bus.topology import SLOTS_BUCKET, ensure_topology
        from trainyard.kube.client import KubeClient
        from trainyard.kube import resources as r
        from trainyard.multicluster.registry import WorkerRegistry, WorkerState

        self.r = r
        self.nc = await nats.connect(self.nats_url)
        self.js = self.nc.jetstream()
        await ensure_topology(self.js)
        self.kv = await self.js.key_value(SLOTS_BUCKET)
        try:
            await self.kv.purge(f"manager.{WORKER}")  # the holds an earlier test left
        except Exception:
            pass
        self.manager = await KubeClient.from_kubeconfig(str(self.paths[0]))
        self.worker = await KubeClient.from_kubeconfig(str(self.paths[1]))
        nodes = (await self.worker.request("GET", r.NODE.path()))["items"]
        self.registry = WorkerRegistry(self.manager, "kubeflow-system", lost_timeout_s=900)
        # What refresh() learns by probing, set directly: the worker answers, its nodes, no pods.
        self.registry.workers[WORKER] = WorkerState(WORKER, client=self.worker, reachable=True)
        self.registry.workers[WORKER].observe(nodes, [])
        self.registry.listed = True
        return self

    async def __aexit__(self, *exc) -> None:
        await self.manager.close()
        await self.worker.close()
        await self.nc.close()

    def slots(self):
        from trainyard.multicluster.slots import SlotLedger

        return SlotLedger(self.kv, "manager")  # a process's own view of the shared slots

    def dispatcher(self, registry=None):
        from trainyard_services.dispatcher.service import Dispatcher

        return Dispatcher(None, self.manager, "manager", registry or self.registry, self.slots())

    async def create(self, *names: str) -> None:
        for name in names:
            await self.manager.create(self.r.TRAINJOB, "default", delegated(name))

    async def placed(self, name: str) -> str | None:
        tj = await self.manager.get(self.r.TRAINJOB, "default", name)
        return ((tj["metadata"].get("annotations") or {}).get(WORKER_ANNOTATION)) if tj else None

    async def dispatched(self, name: str) -> dict | None:
        tj = await self.manager.get(self.r.TRAINJOB, "default", name)
        return next((c for c in (tj.get("status") or {}).get("conditions") or [] if c["type"] == "Dispatched"), None)

    async def copy(self, name: str) -> dict | None:
        return await self.worker.get(self.r.TRAINJOB, "default", name)

    async def clean(self) -> None:
        from trainyard.kube.client import KubeError

        for client in (self.manager, self.worker):
            for tj in (await client.request("GET", self.r.TRAINJOB.path("default")))["items"]:
                name = tj["metadata"]["name"]
                try:
                    await client.merge_patch(self.r.TRAINJOB, "default", name, {"metadata": {"finalizers": None}})
                except KubeError as err:
                    if not err.not_found:  # gone since the list (a copy the dispatcher removed)
                        raise
                await client.delete(self.r.TRAINJOB, "default", name)


def run(clusters, scenario) -> None:
    manager, worker, nats_server = clusters

    async def main() -> None:
        async with Setup(manager.kubeconfig, worker.kubeconfig, nats_server.url) as setup:
            try:
                await scenario(setup)
            finally:
                await setup.clean()

    asyncio.run(main())


def test_a_trainjob_placed_while_the_resync_lists_stays_counted(clusters):
    async def scenario(setup):
        dispatcher = setup.dispatcher()
        await setup.create("a")
        await dispatcher.resync()
        assert await setup.placed("a") == WORKER, await setup.dispatched("a")

        # The resync's list answers before "b" exists; "b" is placed (an event) before the
        # resync goes on with that list.
        real = setup.manager.request
        listed, go_on = asyncio.Event(), asyncio.Event()

        async def held_list(method, path, *args, **kwargs):
            answer = await real(method, path, *args, **kwargs)
            if method == "GET" and path == setup.r.TRAINJOB.path():
                listed.set()
                await go_on.wait()
            return answer

        setup.manager.request = held_list
        resync = asyncio.ensure_future(dispatcher.resync())
        await listed.wait()
        setup.manager.request = real
        await setup.create("b")
        await dispatcher.reconcile("default", "b")
        assert await setup.placed("b") == WORKER
        go_on.set()
        await resync

        await setup.create("c")  # the worker's two pod slots are taken by a and b
        await dispatcher.reconcile("default", "c")
        assert await setup.placed("c") is None
        assert (await setup.dispatched("c"))["reason"] == "InsufficientCapacity"
        assert await setup.copy("c") is None

    run(clusters, scenario)


def test_a_restarted_dispatcher_counts_what_is_placed_before_it_places(clusters):
    async def scenario(setup):
        before = setup.dispatcher()
        await setup.create("a", "b")
        await before.resync()
        assert {await setup.placed("a"), await setup.placed("b")} == {WORKER}

        after = setup.dispatcher()  # the restarted process: nothing in memory
        # The first triggers after the restart: a's copy changed on the worker (its event),
        # and a new TrainJob c was created (its event), both before the first resync.
        await after.reconcile("default", "a", copy_hint=(WORKER, await setup.copy("a")))
        await setup.create("c")
        await after.reconcile("default", "c")
        assert await setup.placed("c") is None
        await after.resync()
        assert await setup.placed("c") is None
        assert (await setup.dispatched("c"))["reason"] == "InsufficientCapacity"

    run(clusters, scenario)


def test_a_runtime_lookup_that_fails_places_nothing(clusters):
    async def scenario(setup):
        from trainyard.kube.client import KubeError

        dispatcher = setup.dispatcher()
        await setup.create("a", "b")
        await dispatcher.resync()
        assert {await setup.placed("a"), await setup.placed("b")} == {WORKER}

        real = setup.manager.request
        runtime_path = setup.r.CLUSTER_TRAINING_RUNTIME.path(None, "one-pod")

        async def timing_out(method, path, *args, **kwargs):
            if method == "GET" and path == runtime_path:
                raise KubeError(0, "TimeoutError", "the manager did not answer within 5s")
            return await real(method, path, *args, **kwargs)

        dispatcher.placer.forget_runtimes()  # the cached answer has expired
        setup.manager.request = timing_out
        try:
            await setup.create("c")
            await dispatcher.reconcile("default", "c")
            assert await setup.placed("c") is None  # unknown requests are not "nothing"
        finally:
            setup.manager.request = real
        await dispatcher.reconcile("default", "c")
        assert await setup.placed("c") is None
        assert (await setup.dispatched("c"))["reason"] == "InsufficientCapacity"

    run(clusters, scenario)


def test_a_sweep_of_stale_copies_does_not_hold_up_placement(clusters):
    async def scenario(setup):
        from trainyard.multicluster.registry import WorkerRegistry

        stale = delegated("stale-1")  # a copy whose manager TrainJob is gone
        del stale["spec"]["managedBy"]
        stale["metadata"].update(labels={"kueue.x-k8s.io/multikueue-origin": "manager"},
                                 annotations={"trainyard.kubeflow.org/origin-uid": "gone"})
        await setup.worker.create(setup.r.TRAINJOB, "default", stale)
        await setup.create("p")

        registry = WorkerRegistry(setup.manager, "kubeflow-system", lost_timeout_s=900)
        dispatcher = setup.dispatcher(registry)
        registry.on_reachable = dispatcher.worker_reachable
        await registry.refresh()  # the worker answers: its sweep is due
        client = registry.workers[WORKER].client
        real, deleting, released = client.request, asyncio.Event(), asyncio.Event()

        async def slow_delete(method, path, *args, **kwargs):  # a worker that deletes slowly
            if method == "DELETE":
                deleting.set()
                await released.wait()
            return await real(method, path, *args, **kwargs)

        client.request = slow_delete
        stop = asyncio.Event()
        loops = asyncio.ensure_future(dispatcher.run_loops(stop, probe_interval_s=0.2, resync_interval_s=0.2))
        try:
            await asyncio.wait_for(deleting.wait(), 30)
            for _ in range(150):  # placed while the sweep's DELETE hangs
                if await setup.placed("p") is not None or loops.done():
                    break
                await asyncio.sleep(0.2)
            assert not loops.done(), loops
            assert await setup.placed("p") == WORKER, "nothing placed while a sweep was deleting"
        finally:
            released.set()
            stop.set()
            await asyncio.wait_for(loops, 30)
            await registry.close()
        assert await setup.placed("p") == WORKER
        for _ in range(100):
            if await setup.copy("stale-1") is None:
                break
            await asyncio.sleep(0.2)
        assert await setup.copy("stale-1") is None

    run(clusters, scenario)


def test_a_worker_that_cannot_say_whether_it_has_the_runtime_is_asked_again(clusters, monkeypatch):
    """A runtime lookup on a worker that times out is not "runtime not found" (the soak showed
    336 TrainJobs with a false RuntimeNotFound condition); and a pass over many waiting
    TrainJobs asks each worker once, not once per TrainJob (those many GETs at once were what
    timed out)."""
    from trainyard.multicluster import placer

    # "Once" is the shared lookup and its cache, not how fast five reconciles run: on a loaded
    # machine they can span more than the 2-s cache, and the last one would rightly ask again.
    monkeypatch.setattr(placer, "RUNTIME_CACHE_S", 3600.0)
    async def scenario(setup):
        from trainyard.kube.client import KubeError

        dispatcher = setup.dispatcher()
        await dispatcher.resync()  # nothing placed yet: counted
        runtime_path = setup.r.CLUSTER_TRAINING_RUNTIME.path(None, "one-pod")
        real, asked = setup.worker.request, []

        async def timing_out(method, path, *args, **kwargs):
            if method == "GET" and path == runtime_path:
                raise KubeError(0, "TimeoutError", "the worker did not answer within 5s")
            return await real(method, path, *args, **kwargs)

        setup.worker.request = timing_out
        try:
            await setup.create("q")
            await dispatcher.reconcile("default", "q")
            assert await setup.placed("q") is None
            assert await setup.dispatched("q") is None  # nothing said that is not known
        finally:
            setup.worker.request = real

        async def counted(method, path, *args, **kwargs):
            if method == "GET" and path == runtime_path:
                asked.append(path)
            return await real(method, path, *args, **kwargs)

        setup.worker.request = counted
        try:
            await setup.create("m0", "m1", "m2", "m3")
            await asyncio.gather(*(dispatcher.reconcile("default", name) for name in ("q", "m0", "m1", "m2", "m3")))
        finally:
            setup.worker.request = real
        assert len(asked) == 1
        placed = [name for name in ("q", "m0", "m1", "m2", "m3") if await setup.placed(name) == WORKER]
        assert len(placed) == 2  # the worker's two pod slots
        waiting = [await setup.dispatched(n) for n in ("q", "m0", "m1", "m2", "m3") if n not in placed]
        assert {c["reason"] for c in waiting} == {"InsufficientCapacity"}

    run(clusters, scenario)


async def events_of(setup, name: str, reason: str) -> list[dict]:
    listed = await setup.manager.request("GET", "/api/v1/namespaces/default/events")
    return [e for e in listed["items"]
            if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "TrainJob"
            and e["reason"] == reason]


def second_registry(setup):
    """Another replica's registry: its own client of the worker, the same summary."""
    from trainyard.multicluster.registry import WorkerRegistry, WorkerState

    registry = WorkerRegistry(setup.manager, "kubeflow-system", lost_timeout_s=900)
    state = registry.workers[WORKER] = WorkerState(WORKER, client=setup.worker, reachable=True)
    state.summarised(setup.registry.workers[WORKER].allocatable, {})
    registry.listed = True
    return registry


def test_two_replicas_never_overcommit_a_worker(clusters):
    """Each replica alone sees the worker's two pod slots free; placing five TrainJobs from both
    at once, in opposite orders, still puts only two on it (the slots are shared on the bus)."""
    async def scenario(setup):
        one, two = setup.dispatcher(), setup.dispatcher(second_registry(setup))
        names = [f"r{i}" for i in range(5)]
        await setup.create(*names)
        await asyncio.gather(*(one.reconcile("default", n) for n in names),
                             *(two.reconcile("default", n) for n in reversed(names)))
        placed = [n for n in names if await setup.placed(n) == WORKER]
        assert len(placed) == 2, placed
        copies = (await setup.worker.request("GET", setup.r.TRAINJOB.path("default")))["items"]
        assert sorted(c["metadata"]["name"] for c in copies) == sorted(placed)
        for name in set(names) - set(placed):
            condition = await setup.dispatched(name)
            assert condition["status"] == "False" and condition["reason"] == "InsufficientCapacity", condition
            assert "pods=1" in condition["message"], condition  # names what is missing
        assert await events_of(setup, next(iter(set(names) - set(placed))), "InsufficientCapacity")

    run(clusters, scenario)


def test_a_replica_that_loses_the_placement_race_keeps_the_winners_hold(clusters):
    """Found by the test above in a clean-clone run (3 of 5 placed on a 2-slot worker): a hold
    is one per TrainJob, so a replica placing a TrainJob another replica had just placed found
    the hold taken, lost the placement write (409) and gave back the hold the placed TrainJob
    relied on. Made deterministic: the loser places from the TrainJob as it was before."""
    async def scenario(setup):
        one, two = setup.dispatcher(), setup.dispatcher(second_registry(setup))
        await setup.create("w0", "w1", "w2")
        before = await setup.manager.get(setup.r.TRAINJOB, "default", "w0")
        await one.reconcile("default", "w0")
        assert await setup.placed("w0") == WORKER
        await two.reconcile("default", "w0", manager=before)  # a stale view: its write gets 409
        entry = await setup.slots().read(WORKER)
        assert "default/w0" in entry.holds  # the placed TrainJob still holds its slot
        await one.reconcile("default", "w1")
        await one.reconcile("default", "w2")
        assert [await setup.placed(n) for n in ("w0", "w1", "w2")] == [WORKER, WORKER, None]

    run(clusters, scenario)


def test_a_suspended_trainjob_holds_no_slot_and_runs_once_resumed_and_room_frees(clusters):
    async def scenario(setup):
        one, two = setup.dispatcher(), setup.dispatcher(second_registry(setup))
        held = delegated("s")
        held["spec"]["suspend"] = True
        await setup.manager.create(setup.r.TRAINJOB, "default", held)
        await one.reconcile("default", "s")
        assert await setup.placed("s") == WORKER  # its copy waits there, suspended
        assert (await setup.copy("s"))["spec"]["suspend"] is True

        await setup.create("a", "b")  # both slots stay free for them
        await two.reconcile("default", "a")
        await one.reconcile("default", "b")
        assert [await setup.placed("a"), await setup.placed("b")] == [WORKER, WORKER]

        # Resumed while the worker is full: its copy stays suspended, and the TrainJob says why.
        await setup.manager.merge_patch(setup.r.TRAINJOB, "default", "s", {"spec": {"suspend": False}})
        await two.reconcile("default", "s")
        assert (await setup.copy("s"))["spec"]["suspend"] is True
        condition = await setup.dispatched("s")
        assert (condition["status"], condition["reason"]) == ("False", "InsufficientCapacity"), condition
        assert WORKER in condition["message"] and "pods=1" in condition["message"], condition
        assert await events_of(setup, "s", "InsufficientCapacity")
        await one.resync()  # retried: still no room
        assert (await setup.copy("s"))["spec"]["suspend"] is True

        # A running TrainJob is suspended by its user: its slot goes back, and the next resync
        # (of the other replica) resumes s there.
        await setup.manager.merge_patch(setup.r.TRAINJOB, "default", "a", {"spec": {"suspend": True}})
        await one.reconcile("default", "a")
        assert (await setup.copy("a"))["spec"]["suspend"] is True
        await two.resync()
        assert (await setup.copy("s"))["spec"]["suspend"] is False
        condition = await setup.dispatched("s")
        assert (condition["status"], condition["reason"]) == ("True", "Dispatched"), condition

    run(clusters, scenario)


def test_an_unplaceable_trainjob_is_placed_when_capacity_frees(clusters):
    async def scenario(setup):
        dispatcher = setup.dispatcher()
        await setup.create("ua", "ub", "uc")  # names no earlier test used: its Events stay
        for name in ("ua", "ub", "uc"):
            await dispatcher.reconcile("default", name)
        assert await setup.placed("uc") is None
        condition = await setup.dispatched("uc")
        assert (condition["status"], condition["reason"]) == ("False", "InsufficientCapacity"), condition
        assert condition["message"].startswith("no worker cluster has free capacity for pods=1"), condition
        assert len(await events_of(setup, "uc", "InsufficientCapacity")) == 1

        # a is deleted on the manager: its copy goes, then its finalizer and its slot.
        await setup.manager.delete(setup.r.TRAINJOB, "default", "ua")
        await dispatcher.reconcile("default", "ua")
        await dispatcher.reconcile("default", "ua", copy_hint=(WORKER, None))
        assert await setup.manager.get(setup.r.TRAINJOB, "default", "ua") is None
        await dispatcher.resync()
        assert await setup.placed("uc") == WORKER
        assert (await setup.copy("uc"))["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "manager"

    run(clusters, scenario)


def test_a_replica_fed_by_the_bus_lists_the_trainjobs_only_every_few_passes(clusters):
    """Fed its TrainJobs' events by the bus, a replica lists every TrainJob of the manager only
    every LIST_EVERY resync passes and after it takes a partition (a list costs the manager's
    TrainJobs times the replicas): the passes between act on what the events and its own
    writes showed, so a waiting TrainJob is still placed once room frees."""
    from trainyard.bus.consumer import Delivery
    from trainyard.bus.envelopes import ObjectEvent, encode

    async def scenario(setup):
        dispatcher = setup.dispatcher()
        dispatcher.fed_by_events = True  # as subscriber() sets it; the events are handed in below
        real, lists = setup.manager.request, []

        async def counted(method, path, *args, **kwargs):
            if method == "GET" and path == setup.r.TRAINJOB.path():
                lists.append(path)
            return await real(method, path, *args, **kwargs)

        async def event(name: str, kind: str = "MODIFIED") -> None:
            """The manager TrainJob's event as the watcher publishes it, delivered."""
            found = ObjectEvent.from_object("manager", kind, await setup.manager.get(setup.r.TRAINJOB, "default", name))
            await dispatcher.handle(found, Delivery(found.subject(dispatcher.partitions), encode(found), {}, 1, 1))

        setup.manager.request = counted
        await setup.create("la", "lb", "lc")
        for name in ("la", "lb", "lc"):
            await event(name, "ADDED")
        assert [await setup.placed(n) for n in ("la", "lb", "lc")] == [WORKER, WORKER, None]
        assert (await setup.dispatched("lc"))["reason"] == "InsufficientCapacity"
        await dispatcher.resync()  # the first pass lists (and, a full one, sweeps: another list)
        assert len(lists) >= 1
        await asyncio.gather(*dispatcher._sweeping.values())
        lists.clear()

        await setup.manager.merge_patch(setup.r.TRAINJOB, "default", "la", {"spec": {"suspend": True}})
        await event("la")  # its slot goes back
        await dispatcher.resync()  # no list: lc waits for room, as its own last write showed
        assert lists == []
        assert await setup.placed("lc") == WORKER
        assert (await setup.dispatched("lc"))["reason"] == "Dispatched"

        dispatcher._acquired(0)  # a partition taken: what it holds is known only from a list
        await dispatcher.resync()
        assert len(lists) == 1

    run(clusters, scenario)


def test_a_resumed_trainjob_whose_worker_is_full_moves_to_one_with_room(clusters, second_worker):
    async def scenario(setup):
        from trainyard.kube.client import KubeClient
        from trainyard.multicluster.registry import WorkerRegistry, WorkerState

        other = await KubeClient.from_kubeconfig(str(second_worker.kubeconfig))
        try:
            one = setup.dispatcher()  # knows worker-1 only
            held = delegated("mv")
            held["spec"]["suspend"] = True
            await setup.manager.create(setup.r.TRAINJOB, "default", held)
            await setup.create("mv-a", "mv-b")
            for name in ("mv", "mv-a", "mv-b"):
                await one.reconcile("default", name)
            assert [await setup.placed(n) for n in ("mv", "mv-a", "mv-b")] == [WORKER] * 3

            registry = WorkerRegistry(setup.manager, "kubeflow-system", lost_timeout_s=900)
            for name, client in ((WORKER, setup.worker), ("worker-2", other)):
                state = registry.workers[name] = WorkerState(name, client=client, reachable=True)
                state.summarised(setup.registry.workers[WORKER].allocatable, {})
            registry.listed = True
            two = setup.dispatcher(registry)
            await setup.manager.merge_patch(setup.r.TRAINJOB, "default", "mv", {"spec": {"suspend": False}})
            await two.reconcile("default", "mv")

            assert await setup.placed("mv") == "worker-2"
            assert await setup.copy("mv") is None  # the suspended copy on the full worker is gone
            moved = await other.get(setup.r.TRAINJOB, "default", "mv")
            assert moved is not None and not moved["spec"].get("suspend"), moved
            condition = await setup.dispatched("mv")
            assert (condition["status"], condition["reason"]) == ("True", "Dispatched"), condition
            for _ in range(50):  # the Event is written beside the pass
                if any("had no room" in e["message"] for e in await events_of(setup, "mv", "Dispatched")):
                    break
                await asyncio.sleep(0.1)
            assert any("worker cluster worker-1 had no room" in e["message"]
                       for e in await events_of(setup, "mv", "Dispatched"))
        finally:
            for tj in (await other.request("GET", setup.r.TRAINJOB.path("default")))["items"]:
                await other.delete(setup.r.TRAINJOB, "default", tj["metadata"]["name"])
            await other.close()

    run(clusters, scenario)


def test_two_dispatcher_processes_split_the_partitions_and_one_takes_over_a_killed_ones(
        clusters, second_worker, tmp_path):
    """Home replicas (docs/multicluster.md, "Several dispatchers"): two `trainyard dispatcher`
    processes and the manager's watcher on the real bus, two workers declared. The replicas
    split the partitions, and each TrainJob is placed by the replica holding its partition, once,
    with one copy on the worker its placement names (none on the other). One replica SIGKILLed in
    the middle of a burst: the other takes its partitions, and every TrainJob of the burst is
    dispatched, with one copy. The periodic resync is pushed out of the test's time: what the
    killed replica had fetched or not yet read reaches the survivor through its partitions."""
    import os
    import time

    from integration.services.conftest import ServiceProcess, bus_call, leases, wait_for

    manager, _, nats = clusters

    async def purge_holds(session) -> None:
        """What the earlier tests' TrainJobs held (pruned only 30 s after, by design): both
        workers equally free, so the suspended TrainJobs below spread over both."""
        from trainyard.bus.topology import SLOTS_BUCKET

        kv = await session.js.key_value(SLOTS_BUCKET)
        for worker in (WORKER, "worker-2"):
            await kv.purge(f"manager.{worker}")

    bus_call(nats.url, purge_holds)
    manager.kubectl("create", "secret", "generic", "worker-2-kubeconfig", "-n", "kubeflow-system",
                    f"--from-file=kubeconfig={second_worker.kubeconfig}")
    manager.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster", "metadata": {"name": "worker-2"},
        "spec": {"kubeConfig": {"locationType": "Secret", "location": "worker-2-kubeconfig"}}}))
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRAINYARD_PARTITIONS="8")  # the watcher's and theirs
    common = ["--kubeconfig", str(manager.kubeconfig), "--nats-url", nats.url, "--http-port", "0",
              "--cluster", "manager", "--shutdown-grace", "5", "--ack-wait", "3"]
    processes = [ServiceProcess("watcher", common, tmp_path / "watcher.log", env)]
    processes += [ServiceProcess("dispatcher", [*common, "--probe-interval", "1", "--resync-interval", "3600"],
                                 tmp_path / f"dispatcher-{index}.log", env) for index in range(2)]
    watcher, one, two = processes
    workers = {WORKER: clusters[1], "worker-2": second_worker}

    def held_by(process: ServiceProcess) -> set[int]:
        """The partitions ``process`` holds now (its replica id is in its log)."""
        mine = {json.loads(line).get("replica") for line in process.log_path.read_text().splitlines()
                if '"partition acquired"' in line}
        return {p for p, holder in leases(nats.url).get("dispatcher", {}).items() if holder in mine}

    def dispatched_by(process: ServiceProcess) -> set[str]:
        return {json.loads(line)["trainjob"].split("/", 1)[1] for line in process.log_path.read_text().splitlines()
                if '"msg": "dispatched"' in line}

    def trainjobs(cluster) -> dict[str, dict]:
        listed = json.loads(cluster.kubectl("get", "trainjobs", "-n", "default", "-o", "json").stdout)["items"]
        return {tj["metadata"]["name"]: tj for tj in listed}

    def dispatched(names: list[str]) -> dict[str, dict] | None:
        found = trainjobs(manager)
        ok = all(any(c["type"] == "Dispatched" and c["status"] == "True"
                     for c in (found.get(n, {}).get("status") or {}).get("conditions") or []) for n in names)
        return found if ok else None

    def suspended(name: str) -> dict:
        body = delegated(name)
        body["spec"]["suspend"] = True  # holds no slot: any number fit on the two-pod workers
        return body

    def one_copy_each(names: list[str]) -> dict[str, str]:
        """Each TrainJob's worker, after checking it has one copy, there, of this manager TrainJob."""
        placed = wait_for(lambda: dispatched(names), timeout=120, interval=0.5, what=f"{len(names)} dispatched")
        copies = {worker: trainjobs(cluster) for worker, cluster in workers.items()}
        where = {}
        for name in names:
            where[name] = placed[name]["metadata"]["annotations"][WORKER_ANNOTATION]
            holders = [w for w, found in copies.items() if name in found]
            assert holders == [where[name]], (name, holders, where[name])
            copy = copies[where[name]][name]
            assert copy["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "manager"
        return where

    from trainyard.bus.subjects import trainjob_partition

    try:
        for process in processes:
            process.spawn()
        for process in processes:
            process.await_listening()
            process.wait_ready()
        wait_for(lambda: len(held_by(one)) == len(held_by(two)) == 4, timeout=60, interval=0.5,
                 what="two dispatchers holding 4 of the 8 partitions each")
        shares = {"one": held_by(one), "two": held_by(two)}

        first = [f"home-{index}" for index in range(16)]
        manager.kubectl("create", "-f", "-", input="\n---\n".join(json.dumps(suspended(n)) for n in first))
        where = one_copy_each(first)
        assert set(where.values()) == set(workers)  # spread over both: a second copy would show
        # Each TrainJob placed by the replica holding its partition, and by no other.
        for process, share in ((one, shares["one"]), (two, shares["two"])):
            expected = {n for n in first if trainjob_partition("default", n, 8) in share}
            assert dispatched_by(process) & set(first) == expected
        assert held_by(one) == shares["one"] and held_by(two) == shares["two"]  # nothing moved meanwhile

        burst = [f"kill-{index}" for index in range(24)]
        for index, name in enumerate(burst):
            manager.kubectl("create", "-f", "-", input=json.dumps(suspended(name)))
            if index == len(burst) // 2:
                one.kill()
                killed_at = time.monotonic()
        wait_for(lambda: len(held_by(two)) == 8, timeout=30, interval=0.5,
                 what="the surviving dispatcher holding every partition")
        print(f"takeover: every partition leased by the survivor {time.monotonic() - killed_at:.1f} s after SIGKILL")
        one_copy_each(burst)
        placed_twice = dispatched_by(one) & dispatched_by(two)
        assert not placed_twice, placed_twice
    finally:
        for process in reversed(processes):
            process.stop()
        for name, cluster in (("manager", manager), *workers.items()):
            for tj in trainjobs(cluster):
                if tj.startswith(("home-", "kill-")):
                    cluster.kubectl("patch", "trainjob", tj, "-n", "default", "--type=merge",
                                    "-p", '{"metadata":{"finalizers":null}}', check=False)
                    cluster.kubectl("delete", "trainjob", tj, "-n", "default", "--wait=false", check=False)
        manager.kubectl("delete", "multikueuecluster", "worker-2", check=False)
        manager.kubectl("delete", "secret", "worker-2-kubeconfig", "-n", "kubeflow-system", check=False)


def test_a_lookup_that_answered_is_reused_by_callers_arriving_just_after(clusters, monkeypatch):
    """One runtime GET per worker while its answer is fresh, whenever another caller comes in:
    a clean-clone run saw a reconcile that reached the lookup just as the worker's answer
    arrived ask again (the GET in flight was already forgotten, its answer not yet kept)."""
    from trainyard.multicluster import placer

    monkeypatch.setattr(placer, "RUNTIME_CACHE_S", 3600.0)

    async def scenario(setup):
        runtime_path = setup.r.CLUSTER_TRAINING_RUNTIME.path(None, "one-pod")
        real, asked, answered = setup.worker.request, [], asyncio.Event()

        async def counted(method, path, *args, **kwargs):
            if method == "GET" and path == runtime_path:
                asked.append(path)
                response = await real(method, path, *args, **kwargs)
                answered.set()
                return response
            return await real(method, path, *args, **kwargs)

        trainjob = delegated("any")
        setup.worker.request = counted
        try:
            for turns in range(4):  # a second caller 0, 1, 2, 3 turns of the event loop after the answer
                lookups, answered = setup.dispatcher().placer, asyncio.Event()
                asked.clear()

                async def caller_after() -> bool | None:
                    await answered.wait()
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    return await lookups.has_runtime(WORKER, setup.worker, trainjob)

                answers = await asyncio.gather(lookups.has_runtime(WORKER, setup.worker, trainjob), caller_after())
                assert answers == [True, True]
                assert len(asked) == 1, f"a caller {turns} turns after the answer asked again"
        finally:
            setup.worker.request = real

    run(clusters, scenario)


def test_a_slot_write_that_meets_another_replicas_write_first_is_counted_and_retried(clusters):
    """Two replicas' views of one worker's ledger: the one whose view is stale loses its
    compare-and-set, reads the entry again and writes its hold beside the other's, and
    trainyard_dispatcher_slot_write_conflicts_total says so (the cost that grows with replicas)."""
    from trainyard.telemetry import metrics

    async def scenario(setup):
        one, two = setup.slots(), setup.slots()
        await two.read(WORKER)  # two's view, about to be stale
        await one.reserve(WORKER, "default/first", {"pods": 1}, None)
        before = metrics.SLOT_WRITE_CONFLICTS._value.get()
        await two.reserve(WORKER, "default/second", {"pods": 1}, None)
        assert two.conflicts == 1
        assert metrics.SLOT_WRITE_CONFLICTS._value.get() == before + 1
        assert set((await setup.slots().read(WORKER)).holds) == {"default/first", "default/second"}

    run(clusters, scenario)
