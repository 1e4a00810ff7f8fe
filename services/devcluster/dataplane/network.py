"""Per-pod network identities for local processes.

``BridgeNetwork`` (root on Linux): a bridge in the host namespace on a private /24 chosen
from 10.244.0.0/16 that no existing route uses, and per pod a named network namespace with a
veth pair whose pod end is ``eth0``. The pod's address is its own, so two pods can both
listen on 29500. Everything made carries this instance's id in its name; a marker file under
``/run/trainyard-dataplane`` records the owning process, so a later start removes whatever a
crashed instance left behind. Several instances start at once (a stack's manager and workers,
other users' stacks on the same host): each holds an exclusive lock on
``/run/trainyard-dataplane/lock`` while it sweeps, picks its /24 and makes its bridge, so no
instance sweeps another's half-made bridge or picks a /24 another is about to take.

``SharedNetwork`` is the fallback when namespaces cannot be made: every pod uses the host's
network and ``127.0.0.1``; ports are shared (a second listener fails with EADDRINUSE).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import random
import re
import secrets
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Protocol

log = logging.getLogger(__name__)

STATE_DIR = Path("/run/trainyard-dataplane")
LOCK_NAME = "lock"
NETNS_DIR = Path("/run/netns")
NAME_PREFIX = "ty"
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")


class NetworkError(RuntimeError):
    """A namespace, link or address could not be set up."""


@dataclass(frozen=True)
class PodAddress:
    ip: str
    netns: str | None = None  # the named network namespace, None in shared mode

    @property
    def netns_path(self) -> str | None:
        return str(NETNS_DIR / self.netns) if self.netns else None


class PodNetwork(Protocol):
    isolated: bool
    host_ip: str

    async def attach(self) -> PodAddress: ...

    async def release(self, address: PodAddress) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...


async def _run(*argv: str, stdin: bytes | None = None, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {err.decode(errors='replace').strip()}")
    return out.decode(errors="replace")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_netns_processes(netns: str) -> int:
    """SIGKILL every process still inside a named namespace; the count killed."""
    killed = 0
    target = NETNS_DIR / netns
    try:
        target_ino = os.stat(target).st_ino
    except OSError:
        return 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino != target_ino:
                continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (OSError, ValueError):
            continue
    return killed


def _used_networks(route_text: str) -> list[ipaddress.IPv4Network]:
    networks = []
    for line in route_text.splitlines():
        first = line.split(" ", 1)[0]
        if first in ("default", ""):
            continue
        try:
            networks.append(ipaddress.ip_network(first, strict=False))
        except ValueError:
            continue
    return networks


def choose_subnet(route_text: str, rng: random.Random,
                  preferred: ipaddress.IPv4Network | None = None) -> ipaddress.IPv4Network:
    """A /24 inside 10.244.0.0/16 that overlaps no route of the host (pure); ``preferred``
    (the one this data dir had last time) when it is such a /24 and still free."""
    used = _used_networks(route_text)
    candidates = list(range(1, 255))
    rng.shuffle(candidates)
    if preferred is not None and preferred.prefixlen == 24 and preferred.subnet_of(POD_RANGE):
        third = preferred.network_address.packed[2]
        if third in candidates:  # not 10.244.0.0/24 nor .255
            candidates.remove(third)
            candidates.insert(0, third)
    for third in candidates:
        subnet = ipaddress.ip_network(f"10.244.{third}.0/24")
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetworkError("no free /24 left in 10.244.0.0/16 for the pod bridge")


@contextlib.asynccontextmanager
async def _exclusive() -> AsyncIterator[None]:
    """Held across sweep, /24 choice and bridge creation, by every instance on this host.

    Without it, an instance sweeping while another is between writing its marker and making
    its bridge deleted that bridge (the pod-network address a status service then failed to
    bind), and two instances reading the routes at once could pick the same /24. An flock
    dies with its process, so a crashed holder never leaves the host locked."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # flock blocks; in a thread, so the event loop (the API server beside it) runs on.
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class BridgeNetwork:
    isolated = True

    def __init__(self, instance: str, subnet: ipaddress.IPv4Network) -> None:
        self.instance = instance
        self.subnet = subnet
        self.bridge = f"{NAME_PREFIX}b{instance}"
        hosts = list(subnet.hosts())
        self.host_ip = str(hosts[0])
        self._free = [str(ip) for ip in hosts[1:]]
        self._counter = 0
        self._attached: dict[str, PodAddress] = {}
        self._lock = asyncio.Lock()

    @classmethod
    async def create(cls, rng: random.Random | None = None,
                     preferred: ipaddress.IPv4Network | None = None) -> "BridgeNetwork":
        if os.geteuid() != 0 or not shutil.which("ip"):
            raise NetworkError("network namespaces need root and iproute2")
        async with _exclusive():
            await cleanup_stale()
            routes = await _run("ip", "-4", "route", "show", "table", "all")
            instance = secrets.token_hex(3)[:5]
            network = cls(instance, choose_subnet(routes, rng or random.Random(), preferred))
            marker = STATE_DIR / f"{instance}.pid"
            marker.write_text(str(os.getpid()))
            try:
                await _run("ip", "-batch", "-", stdin=(
                    f"link add {network.bridge} type bridge\n"
                    f"addr add {network.host_ip}/{network.subnet.prefixlen} dev {network.bridge}\n"
                    f"link set {network.bridge} up\n").encode())
            except NetworkError:
                await _run("ip", "link", "delete", network.bridge, check=False)
                marker.unlink(missing_ok=True)
                raise
        return network

    def describe(self) -> str:
        return (f"isolated pod networking: network namespace per pod on bridge {self.bridge} "
                f"({self.subnet}, host side {self.host_ip})")

    async def attach(self) -> PodAddress:
        async with self._lock:
            if not self._free:
                raise NetworkError(f"no free pod address left in {self.subnet}")
            ip = self._free.pop(0)
            self._counter += 1
            number = self._counter
        netns = f"{NAME_PREFIX}{self.instance}-{number}"
        host_end = f"{NAME_PREFIX}v{self.instance}{number}"
        pod_end = f"{NAME_PREFIX}p{self.instance}{number}"
        address = PodAddress(ip=ip, netns=netns)
        try:
            await _run("ip", "netns", "add", netns)
            await _run("ip", "-batch", "-", stdin=(
                f"link add {host_end} type veth peer name {pod_end}\n"
                f"link set {pod_end} netns {netns}\n"
                f"link set {host_end} master {self.bridge}\n"
                f"link set {host_end} up\n").encode())
            await _run("ip", "-n", netns, "-batch", "-", stdin=(
                f"link set {pod_end} name eth0\n"
                f"addr add {ip}/{self.subnet.prefixlen} dev eth0\n"
                "link set eth0 up\n"
                "link set lo up\n"
                f"route add default via {self.host_ip}\n").encode())
        except NetworkError:
            await self._remove(address)
            raise
        self._attached[netns] = address
        return address

    async def _remove(self, address: PodAddress) -> None:
        if address.netns:
            kill_netns_processes(address.netns)
            # Deleting the namespace destroys the veth pair with it.
            await _run("ip", "netns", "delete", address.netns, check=False)
        async with self._lock:
            if address.ip not in self._free:
                self._free.append(address.ip)

    async def release(self, address: PodAddress) -> None:
        self._attached.pop(address.netns or "", None)
        await self._remove(address)

    async def close(self) -> None:
        for address in list(self._attached.values()):
            await self.release(address)
        await _run("ip", "link", "delete", self.bridge, check=False)
        (STATE_DIR / f"{self.instance}.pid").unlink(missing_ok=True)


async def cleanup_stale() -> list[str]:
    """Remove namespaces and links of instances whose owning process is gone.

    ``BridgeNetwork.create`` calls it under ``_exclusive``; on its own it is still safe beside
    an instance being made, because markers are read only after the bridges are listed."""
    removed: list[str] = []
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    for marker in STATE_DIR.glob("*.pid"):
        instance = marker.stem
        try:
            pid = int(marker.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and _pid_alive(pid):
            continue
        if NETNS_DIR.is_dir():
            for netns in NETNS_DIR.iterdir():
                if netns.name.startswith(f"{NAME_PREFIX}{instance}-"):
                    kill_netns_processes(netns.name)
                    await _run("ip", "netns", "delete", netns.name, check=False)
                    removed.append(netns.name)
        await _run("ip", "link", "delete", f"{NAME_PREFIX}b{instance}", check=False)
        removed.append(f"{NAME_PREFIX}b{instance}")
        marker.unlink(missing_ok=True)
    # The marker is written before the bridge is made, so a bridge listed here whose marker is
    # missing when read *afterwards* is stale. Reading the markers first deleted a bridge made
    # (marker included) between the two reads.
    links = await _run("ip", "-o", "link", "show", "type", "bridge", check=False)
    live = {marker.stem for marker in STATE_DIR.glob("*.pid")}
    for line in links.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if re.fullmatch(rf"{NAME_PREFIX}b[0-9a-f]{{5}}", name) and name[len(NAME_PREFIX) + 1:] not in live:
            await _run("ip", "link", "delete", name, check=False)
            removed.append(name)
    return removed


class SharedNetwork:
    """Fallback: pods share the host network; every pod address is 127.0.0.1."""

    isolated = False
    host_ip = "127.0.0.1"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def describe(self) -> str:
        return (f"shared-network mode ({self.reason}): pods share the host's ports and "
                "all use 127.0.0.1")

    async def attach(self) -> PodAddress:
        return PodAddress(ip="127.0.0.1")

    async def release(self, address: PodAddress) -> None:
        return None

    async def close(self) -> None:
        return None


async def open_network(prefer_isolated: bool = True,
                       preferred_subnet: ipaddress.IPv4Network | None = None) -> PodNetwork:
    """The best network mode this process may use; isolated, on ``preferred_subnet`` if free."""
    if not prefer_isolated:
        return SharedNetwork("isolation turned off")
    try:
        return await BridgeNetwork.create(preferred=preferred_subnet)
    except (NetworkError, OSError) as err:
        return SharedNetwork(str(err))
