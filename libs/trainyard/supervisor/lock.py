"""One running stack per data dir, enforced with flock on `<data-dir>/.lock`.

The kernel drops the lock when the supervisor dies, however it dies, so a stale pid file never
blocks a new `trainyard up` and never makes `trainyard down` signal an unrelated process.
"""
from __future__ import annotations

import fcntl
import os
from typing import IO

from trainyard.supervisor.layout import StackLayout


class StackAlreadyRunning(Exception):
    pass


def acquire(layout: StackLayout) -> IO[str]:
    handle = layout.lock_file.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        handle.close()
        raise StackAlreadyRunning(str(layout.root)) from err
    os.set_inheritable(handle.fileno(), False)
    return handle


def is_held(layout: StackLayout) -> bool:
    if not layout.lock_file.exists():
        return False
    with layout.lock_file.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False
