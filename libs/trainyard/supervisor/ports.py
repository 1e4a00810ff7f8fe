"""Port choice for a stack: fixed defaults, 0 for "pick a free one", clear errors on clashes."""
from __future__ import annotations

import errno
import fcntl
import functools
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Fixed defaults, away from the well-known ports (4222, 6443, 8080...) so a NATS or a cluster
# already running on this machine does not clash with a local stack.
DEFAULT_NATS_PORT = 14222
DEFAULT_API_PORT = 16443
DEFAULT_SERVICES_PORT = 18081  # watcher, planner, applier, status: 18081..18084
DEFAULT_WEBHOOK_PORT = 19443
DEFAULT_DASHBOARD_PORT = 18080


class PortInUseError(Exception):
    def __init__(self, port: int, purpose: str, option: str) -> None:
        super().__init__(
            f"port {port} ({purpose}) is already in use on {LOOPBACK}; "
            f"choose another with {option} N, or {option} 0 for a free one"
        )
        self.port = port


# Every port free_port() answered in this process: never handed out twice by one process.
_HANDED_OUT: set[int] = set()

# "Pick a free one" takes ports from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default). The kernel gives ports of that range to
# every outgoing connection and to every bind of port 0, so a port found free there can be taken
# by any process's client connection in the seconds before the child it was given listens
# ("address already in use" when a stack's status service started while another test process
# was busy). Below that range only explicit binds compete, and trainyard processes of this
# machine take turns there through one counter file under a lock, so two stacks starting at once
# never get the same port.
FREE_PORTS_FROM = 20000
_MIN_RANGE = 1000
_COUNTER = Path(tempfile.gettempdir()) / f"trainyard-free-ports-{os.getuid()}"


@functools.cache  # a stack asks for dozens of ports; the kernel setting does not move meanwhile
def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on right now, below the kernel's ephemeral range, never one this
    process or another trainyard process of this user was given recently (each takes the next
    free port after the last one handed out, wrapping around the range)."""
    low, high = FREE_PORTS_FROM, _ephemeral_start()
    if high - low < _MIN_RANGE:  # an unusual kernel setting: the kernel's own choice
        return _kernel_free_port()
    with os.fdopen(os.open(_COUNTER, os.O_RDWR | os.O_CREAT, 0o600), "r+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)  # released when the file is closed
        try:
            last = int(counter.read().strip() or low - 1)
        except ValueError:
            last = low - 1
        for step in range(1, high - low + 1):
            port = low + (last - low + step) % (high - low)
            if port not in _HANDED_OUT and port_is_free(port):
                counter.seek(0)
                counter.truncate()
                counter.write(str(port))
                _HANDED_OUT.add(port)
                return port
    return _kernel_free_port()


def _kernel_free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # No SO_REUSEADDR: a port in TIME_WAIT is usable by our children, which set it themselves,
        # but a port someone listens on must fail here.
        try:
            sock.bind((LOOPBACK, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


@dataclass(frozen=True)
class PortRequest:
    """One port the stack needs: what it is for and the option that sets it."""

    requested: int
    purpose: str
    option: str

    def resolve(self) -> int:
        if self.requested == 0:
            return free_port()
        if not 0 < self.requested < 65536:
            raise ValueError(f"{self.option}: {self.requested} is not a port number (1-65535, or 0 for a free one)")
        if not port_is_free(self.requested):
            raise PortInUseError(self.requested, self.purpose, self.option)
        return self.requested
