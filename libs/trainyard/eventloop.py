"""How a trainyard process runs: its event loop and its garbage collector.

The devcluster (its single process and each API worker of ``--api-workers N``) and every
service (``trainyard.host.service.run_service``) run their main coroutine through ``run``:

- **uvloop** instead of asyncio's pure-Python selector loop. Every request and every bus
  message crosses the loop's transport, TLS and callback scheduling several times; uvloop does
  that in C (libuv): about a tenth of the devcluster's CPU per server-side apply, and 6-7 % of
  the four services' CPU per TrainJob (docs/performance.md).
- **A larger first generation for the cyclic collector** (``GC_THRESHOLDS``). A request (or a
  bus message's handling) allocates a few thousand containers (decoded bodies, field sets,
  schema walks) that reference counting frees when it ends; at Python's default of 700 the collector ran several
  times per request and traversed the containers of every request in flight, promoting them
  to older generations it then traversed again. Nothing is kept longer: only fewer, later
  collections of what is garbage anyway.
- **``freeze_startup``**: what the server built before it serves (the registry, the schemas
  of the built-in kinds, compiled rules) is moved out of the collector's generations, so the
  rare full collections do not walk it again and again.
- **``exit_process``**: a service that has stopped gracefully ends without the interpreter's
  teardown of its heap.
"""
from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from typing import Any, Coroutine, NoReturn, TypeVar

import uvloop

T = TypeVar("T")

# (first generation, second, third): collections of the first generation start after this
# many new containers (700 by default), the second after 20 of the first, the third after 100
# of the second (and only when a quarter of the long-lived objects are new, as always).
GC_THRESHOLDS = (10_000, 20, 100)

_owns_process = False  # set by ``run``: the collector is this module's to tune


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new uvloop event loop, with the collector tuned (the
    process's main loop; a helper thread's loop stays asyncio's own)."""
    global _owns_process
    _owns_process = True
    gc.set_threshold(*GC_THRESHOLDS)
    return uvloop.run(main)


def freeze_startup() -> None:
    """Move every object allocated so far to the collector's permanent generation (called
    once the server is built, before it serves). Frozen objects are still freed by reference
    counting; only the cyclic collector no longer scans them. Only in a process ``run``
    started: a server embedded in another program leaves that program's collector alone."""
    if _owns_process:
        gc.collect()
        gc.freeze()


def exit_process(code: int) -> NoReturn:
    """Ends a service process whose own stop is complete (its work handed over, its connections
    closed), skipping the interpreter's teardown: freeing every module and object of a service's
    heap (the API models, compiled admission rules, the bus client) one by one took 0.3-0.6 s of
    CPU per process, at every `trainyard down` and every restart, for memory the kernel takes
    back at once anyway. What teardown does that matters runs first: the atexit callbacks
    (logging flushes and closes its handlers, OpenTelemetry flushes its spans) and the flush of
    the standard streams."""
    try:
        atexit._run_exitfuncs()  # what normal interpreter exit runs first
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or the reader went away
                pass
        os._exit(code)
