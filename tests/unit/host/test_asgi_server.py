"""The services' uvicorn server ticks once a second, not ten times (an idle planner woke as often
for uvicorn's tick as for all its bus work), and still stops as soon as it is asked to."""
from __future__ import annotations

import asyncio
import socket
import time

import httpx
import uvicorn

from trainyard.host.asgi_server import QuietServer


async def app(scope, receive, send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_an_idle_server_ticks_once_a_second_and_stops_at_once() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = QuietServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    ticks = 0
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        nonlocal ticks
        ticks += 1
        return await on_tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    serving = asyncio.create_task(server._serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{port}/")
    assert answer.status_code == 200 and answer.headers.get("date")  # the Date header is kept
    ticks = 0
    await asyncio.sleep(2.5)
    assert 2 <= ticks <= 4, ticks  # uvicorn's own loop: 25
    asked = time.monotonic()
    server.should_exit = True
    await asyncio.wait_for(serving, timeout=5)
    assert time.monotonic() - asked < 0.5
