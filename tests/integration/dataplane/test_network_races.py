"""Two pod networks made at once on one host (a stack's manager and workers start their
devclusters together; other users' stacks run beside them): real bridges, real ``ip``.

The interleavings are forced: one instance is held at a chosen ``ip`` command while the
other runs until it has finished or waits for the host-wide lock. Each test uses its own
state directory and name prefix, so live instances of other users are neither seen nor touched.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import shutil
import socket
import subprocess

import pytest

from trainyard_services.devcluster.dataplane import network
from trainyard_services.devcluster.dataplane.network import BridgeNetwork

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="bridges need root and iproute2")


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    # Unique per test run: a concurrent run's sweep (its own state dir) must not match ours.
    name = "tq" + secrets.token_hex(2)[:3]
    monkeypatch.setattr(network, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(network, "NAME_PREFIX", name)
    yield name
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        bridge = line.split(":")[1].strip()
        if bridge.startswith(name):
            subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


class Interleaving:
    """Holds the task named ``held`` at the first ``ip`` command starting with ``at`` (before
    it runs, or after with ``after=True``) until ``release()``; ``other_stuck`` is set when
    the task named ``other`` has finished or is waiting for the host-wide lock."""

    def __init__(self, monkeypatch, held: str, other: str, at: tuple[str, ...], after: bool = False) -> None:
        self.held_there = asyncio.Event()
        self.other_stuck = asyncio.Event()
        self._go = asyncio.Event()
        real_run = network._run
        real_exclusive = getattr(network, "_exclusive", None)

        async def run(*argv: str, **kwargs):
            hold = asyncio.current_task().get_name() == held and argv[:len(at)] == at and not self._go.is_set()
            if hold and not after:
                self.held_there.set()
                await self._go.wait()
            out = await real_run(*argv, **kwargs)
            if hold and after:
                self.held_there.set()
                await self._go.wait()
            return out

        @contextlib.asynccontextmanager
        async def exclusive():
            if asyncio.current_task().get_name() == other:
                self.other_stuck.set()  # the holder has the lock until it is released
            async with real_exclusive():
                yield

        monkeypatch.setattr(network, "_run", run)
        # raising=False: the same test shows the failure on a network.py without the lock.
        monkeypatch.setattr(network, "_exclusive", exclusive if real_exclusive else None, raising=False)

    def release(self) -> None:
        self._go.set()

    async def run_both(self, held_create, other_create, held: str, other: str) -> tuple[BridgeNetwork, BridgeNetwork]:
        first = asyncio.create_task(held_create(), name=held)
        await self.held_there.wait()
        second = asyncio.create_task(other_create(), name=other)
        second.add_done_callback(lambda _: self.other_stuck.set())
        await self.other_stuck.wait()
        self.release()
        results = await asyncio.gather(first, second, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                for made in results:
                    if isinstance(made, BridgeNetwork):
                        await made.close()
                raise result
        return results[0], results[1]


def bind_error(address: str) -> str | None:
    """What a server binding ``address`` (as the status service does) is told, None if it binds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError as err:
            return f"{address}: {err}"
    return None


def bridge_addresses(bridge: str) -> str:
    return subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True).stdout


async def test_a_sweep_while_another_instance_makes_its_bridge_leaves_that_bridge(prefix, monkeypatch):
    """B's start-up sweep is held between its read of the markers and its list of bridges
    while A writes its marker and makes its bridge: A's bridge and address must survive
    (the sweep deleted it; a worker's status service then failed to bind 10.244.x.1 with
    'Cannot assign requested address')."""
    steps = Interleaving(monkeypatch, held="B", other="A", at=("ip", "-o", "link", "show", "type", "bridge"))
    b, a = await steps.run_both(BridgeNetwork.create, BridgeNetwork.create, "B", "A")
    try:
        assert [bind_error(a.host_ip), bind_error(b.host_ip)] == [None, None]
        assert f"inet {a.host_ip}/24" in bridge_addresses(a.bridge)
        assert f"inet {b.host_ip}/24" in bridge_addresses(b.bridge)
        assert sorted(p.name for p in network.STATE_DIR.glob("*.pid")) == sorted([f"{a.instance}.pid", f"{b.instance}.pid"])
    finally:
        await a.close()
        await b.close()
    assert not bridge_addresses(a.bridge) and not bridge_addresses(b.bridge)


async def test_two_instances_reading_the_routes_at_once_take_different_subnets(prefix, monkeypatch):
    """A has read the host's routes but not yet made its bridge when B starts; both would
    pick the same /24 (the same random sequence forces it): B must choose after A's route
    exists. Two bridges with one subnet leave the pods behind the second unreachable."""
    steps = Interleaving(monkeypatch, held="A", other="B", at=("ip", "-4", "route", "show"), after=True)
    a, b = await steps.run_both(lambda: BridgeNetwork.create(random.Random(7)),
                                lambda: BridgeNetwork.create(random.Random(7)), "A", "B")
    try:
        assert a.subnet != b.subnet
        routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
        assert f"{a.subnet} dev {a.bridge}" in routes and f"{b.subnet} dev {b.bridge}" in routes
    finally:
        await a.close()
        await b.close()


async def test_an_instance_takes_its_data_dirs_last_subnet_when_free(prefix):
    """A restarted devcluster keeps its Node address (what the status service was told to
    bind) when its last /24 is still free, and takes another when a live instance has it."""
    first = await BridgeNetwork.create()
    last = first.subnet
    await first.close()
    again = await BridgeNetwork.create(preferred=last)
    try:
        assert again.subnet == last
        beside = await BridgeNetwork.create(preferred=last)
        try:
            assert beside.subnet != last
            assert bind_error(again.host_ip) is None and bind_error(beside.host_ip) is None
        finally:
            await beside.close()
    finally:
        await again.close()
