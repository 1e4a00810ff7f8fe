"""uvicorn's server for the service that serves an ASGI app (the dashboard),
without its ten wake-ups a second.

uvicorn's ``Server.main_loop`` sleeps 0.1 s at a time to refresh the ``Date`` header (every tenth
tick) and to notice ``should_exit``: an idle planner woke ten times a second for it, about as often
as for all its bus work together (issue #33: an idle replica should cost almost nothing). Here
the loop ticks once a second, when the header is refreshed anyway, and ``should_exit = True``
wakes it at once, so a stop is as prompt as before.
"""
from __future__ import annotations

import asyncio

import uvicorn

TICK_S = 1.0


class QuietServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked = asyncio.Event()
        self._should_exit = False
        super().__init__(config)

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        # Set from uvicorn's signal handler too (a plain assignment in its own code).
        self._should_exit = value
        if value:
            self._exit_asked.set()

    async def main_loop(self) -> None:
        # on_tick refreshes the Date header when its counter is a multiple of 10 (its 0.1-s
        # ticks), checks should_exit and the request limit; each call here is a second apart.
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000
            try:
                await asyncio.wait_for(self._exit_asked.wait(), timeout=TICK_S)
            except asyncio.TimeoutError:
                pass
