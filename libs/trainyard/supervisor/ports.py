"""Port choice for a stack: fixed defaults, 0 for "pick a free one", clear errors on clashes."""
from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

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


# Every port free_port() answered in this process: the kernel may hand out a port again as
# soon as the probing socket is closed, and a stack asks for dozens before any is listened on
# (two children once got the same one: "Address already in use" at start).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on right now (the kernel's choice for port 0), never one this
    process was already given."""
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
