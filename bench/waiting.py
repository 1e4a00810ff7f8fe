"""Waits of the benchmarks: each has a budget, says what it waits for while it waits, and ends the
run non-zero with what was missing when the budget is spent (a bench that stalls, e.g. on full pod
slots of the workers, must not wait silently until someone kills it)."""
from __future__ import annotations

import asyncio
import inspect
import sys
import time
from typing import Awaitable, Callable

SAY_EVERY_S = 5.0


class GaveUp(SystemExit):
    """A wait ran out of its budget: the run ends with this message and exit status 1."""


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def wait_until(what: str, done: Callable[[], bool | Awaitable[bool]], budget_s: float, *,
                     progress: Callable[[], str] | None = None, wake: asyncio.Event | None = None,
                     poll_s: float = 0.2, say_every_s: float = SAY_EVERY_S,
                     stall_s: float | None = None) -> float:
    """Polls ``done`` (or waits for ``wake`` between polls) until it is true; returns the seconds
    it took. Every ``say_every_s`` prints ``waiting Ns of Bs for <what>: <progress>`` to stderr;
    past ``budget_s``, or when ``progress`` has not changed for ``stall_s``, raises
    :class:`GaveUp` naming what and how far it got."""
    began = time.monotonic()
    next_say = began + say_every_s
    last_state, changed_at = None, began
    while True:
        answer = done()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return time.monotonic() - began
        now = time.monotonic()
        state = progress() if progress is not None else "not yet"
        if state != last_state:
            last_state, changed_at = state, now
        if now - began > budget_s:
            raise GaveUp(f"error: gave up after {budget_s:g}s waiting for {what}: {state}")
        if stall_s is not None and progress is not None and now - changed_at > stall_s:
            raise GaveUp(f"error: gave up waiting for {what}: no progress for {stall_s:g}s ({state})")
        if now >= next_say:
            say(f"waiting {now - began:.0f}s of {budget_s:g}s for {what}: {state}")
            next_say = now + say_every_s
        if wake is not None:
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), timeout=min(poll_s * 5, max(next_say - now, 0.01)))
            except asyncio.TimeoutError:
                pass
        else:
            await asyncio.sleep(poll_s)


def missing(keys: list[str], have: set[str] | dict, shown: int = 3) -> str:
    """``k/N arrived; missing e.g. a, b, c``."""
    absent = [key for key in keys if key not in have]
    text = f"{len(keys) - len(absent)}/{len(keys)} arrived"
    if absent:
        text += "; missing e.g. " + ", ".join(absent[:shown])
    return text


def stop_process(process, timeout_s: float = 20.0) -> None:
    """SIGTERM (already sent by the caller or here), then SIGKILL after ``timeout_s``: a bench's
    teardown never waits without end on a process that ignores SIGTERM."""
    import subprocess

    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        say(f"process {process.pid} ignored SIGTERM for {timeout_s:g}s: killed")
        process.kill()
        process.wait()
