"""Stopping a stack from outside (`trainyard down`) and clearing what a crashed one left behind."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from trainyard.supervisor import lock
from trainyard.supervisor.layout import StackLayout
from trainyard.supervisor.proctable import ProcessId, signal_group, signal_process
from trainyard.supervisor.state import read_pid_file, read_state


@dataclass
class StopReport:
    supervisor_pid: int | None = None
    supervisor_stopped: bool = False
    killed: list[str] = field(default_factory=list)

    @property
    def found_anything(self) -> bool:
        return self.supervisor_stopped or bool(self.killed)


def _wait_gone(process: ProcessId, timeout_s: float, waiting: Callable[[float], None] | None = None,
               say_every_s: float = 10.0) -> bool:
    """Until ``process`` has exited (True) or ``timeout_s`` has passed (False); ``waiting`` hears
    the seconds waited so far every ``say_every_s``."""
    began = time.monotonic()
    next_say = began + say_every_s
    while process.is_alive():
        now = time.monotonic()
        if now - began > timeout_s:
            return False
        if waiting is not None and now >= next_say:
            waiting(now - began)
            next_say = now + say_every_s
        time.sleep(0.1)
    return True


def kill_leftover_children(layout: StackLayout) -> list[str]:
    """SIGKILL the process groups of recorded children that still run (their supervisor is gone)."""
    state = read_state(layout)
    if state is None:
        return []
    killed = []
    for name, child in state.children.items():
        if signal_group(child, signal.SIGKILL):
            _wait_gone(child, 5.0)
            killed.append(f"{name} (pid {child.pid})")
    return killed


def stop_stack(layout: StackLayout, timeout_s: float = 60.0, say: Callable[[str], None] | None = None) -> StopReport:
    """Ask the supervisor to stop (SIGTERM: it stops services, devcluster, NATS in order), wait,
    and SIGKILL whatever is left of it and its recorded children after `timeout_s`; ``say``
    hears what is still awaited while it waits."""
    report = StopReport()
    state = read_state(layout)
    pid = read_pid_file(layout)
    # Only a supervisor holding the data dir's lock is signalled: a pid file left by a crashed one
    # may name a pid the system has since given to something else.
    if pid is not None and lock.is_held(layout):
        recorded = state.supervisor if state and state.supervisor.pid == pid else ProcessId.of(pid)
        report.supervisor_pid = pid
        if signal_process(recorded, signal.SIGTERM):
            def waiting(seconds: float) -> None:
                if say is not None:
                    say(f"trainyard: waiting {seconds:.0f}s of {timeout_s:g}s for the supervisor (pid {pid}) to "
                        "stop the services, devcluster and NATS; then what is left is killed")

            if not _wait_gone(recorded, timeout_s, waiting):
                signal_process(recorded, signal.SIGKILL)
                _wait_gone(recorded, 5.0)
            report.supervisor_stopped = True
    report.killed = kill_leftover_children(layout)
    layout.pid_file.unlink(missing_ok=True)
    return report
