"""The dashboard probes (services, backlog, workers, the stack's window) only while someone looks:
a browser on the live stream, or a snapshot asked lately. Unwatched, an idle stack's dashboard
probed every service and listed every consumer every 2 s for no one."""
from __future__ import annotations

import asyncio

from trainyard_services.dashboard import live as live_module
from trainyard_services.dashboard.live import Live

INTERVAL_S = 0.02


async def rounds_over(live: Live, seconds: float) -> int:
    before = live._rounds["stack"]
    await asyncio.sleep(seconds)
    return live._rounds["stack"] - before


async def unwatched(live: Live) -> None:
    while live.watched():
        await asyncio.sleep(0.05)
    await asyncio.sleep(5 * INTERVAL_S)  # the round under way, if any, ends


async def test_unwatched_probes_pause_and_a_snapshot_or_a_browser_brings_them_back(monkeypatch) -> None:
    monkeypatch.setattr(live_module, "WATCH_WINDOW_S", 0.3)
    live = Live(bus=None, clusters=["c"])  # type: ignore[arg-type] - the stack loop touches no bus
    stop = asyncio.Event()
    loop = asyncio.create_task(live.watch_stack(stop, interval_s=INTERVAL_S))
    try:
        await unwatched(live)
        assert await rounds_over(live, 0.5) == 0  # nobody looked: not one round (polling: 25)

        # A snapshot brings the probes up to date before it answers, and they go on a while.
        before = live._rounds["stack"]
        await live.fresh_snapshot()
        assert live._rounds["stack"] > before
        assert await rounds_over(live, 0.1) >= 1

        await unwatched(live)
        assert await rounds_over(live, 0.3) == 0

        # A browser on the live stream keeps them running as long as it stays.
        queue = live.listen()
        await asyncio.sleep(0.5)  # past the window: the browser alone keeps them going
        assert await rounds_over(live, 0.2) >= 1
        live.forget(queue)
        await unwatched(live)
        assert await rounds_over(live, 0.3) == 0
    finally:
        stop.set()
        await asyncio.wait_for(loop, 2)
