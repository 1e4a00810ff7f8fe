"""NATS connection with reconnect (forever, with a short wait), logging the transitions.

Every connection checks the server's version (the ``version`` of its INFO line) once: the bus
uses batched direct gets (``multi_last``) and per-message TTL, which nats-server has had since
2.11; against an older server reads and expiry would fail later in obscure ways, so the
connection is refused at once with :class:`ServerTooOld`.
"""
from __future__ import annotations

import logging
import re
import ssl
from typing import Any, Callable

import nats
from nats.aio.client import Client

from trainyard.bus.auth import Credentials, from_environment
from trainyard.errortext import describe

log = logging.getLogger(__name__)

MINIMUM_SERVER_VERSION = (2, 11)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


class ServerTooOld(Exception):
    """The NATS server is older than the bus needs; retrying cannot help."""


def check_server_version(version: str, url: str) -> None:
    """Raises :class:`ServerTooOld` unless ``version`` (as the server's INFO gives it) is at
    least :data:`MINIMUM_SERVER_VERSION`; an unreadable version is refused as well."""
    match = _VERSION.match(version or "")
    if match and (int(match.group(1)), int(match.group(2))) >= MINIMUM_SERVER_VERSION:
        return
    needed = ".".join(str(part) for part in MINIMUM_SERVER_VERSION)
    raise ServerTooOld(f"nats-server {version or '(no version)'} at {url} is too old: trainyard needs "
                       f"nats-server >= {needed} (batched direct gets, per-message TTL)")


async def connect(
    url: str,
    name: str,
    *,
    on_state: Callable[[bool], None] | None = None,
    connect_timeout_s: float = 5.0,
    reconnect_wait_s: float = 0.5,
    credentials: Credentials | None = None,
) -> Client:
    """Connects to NATS; reconnects forever. ``on_state(True/False)`` follows connectivity.

    ``credentials`` (default: the file ``$TRAINYARD_NATS_CREDENTIALS`` names, if any): the
    identity's NKey, its own inbox prefix, and the CA that the server's TLS certificate must
    chain to (docs/security.md)."""
    if credentials is None:
        credentials = from_environment()
    secured: dict[str, Any] = {}
    if credentials is not None:
        secured = {"nkeys_seed_str": credentials.seed, "inbox_prefix": credentials.inbox_prefix}
        if credentials.ca_pem:
            secured["tls"] = ssl.create_default_context(cadata=credentials.ca_pem)

    def notify(connected: bool) -> None:
        if on_state is not None:
            on_state(connected)

    async def disconnected() -> None:
        if not client.is_closed and not client.is_draining:  # not our own close()
            log.warning("nats disconnected", extra={"nats_url": url})
        notify(False)

    async def reconnected() -> None:
        log.info("nats reconnected", extra={"nats_url": url})
        notify(True)

    async def error(err: Exception) -> None:
        log.warning("nats error: %s", describe(err))

    async def closed() -> None:
        notify(False)

    client: Client
    client = await nats.connect(
        # Several servers of one NATS cluster may be given comma-separated; the client also learns
        # the others from the cluster and reconnects to a survivor when its server goes away.
        servers=[part.strip() for part in url.split(",") if part.strip()],
        name=name,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=reconnect_wait_s,
        connect_timeout=connect_timeout_s,
        # Keep publishing into the client's buffer while the server is away (bounded).
        pending_size=64 * 1024 * 1024,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
        closed_cb=closed,
        **secured,
    )
    try:
        # nats-py keeps the server's INFO as it came (its ServerVersion parser raises on forms
        # such as "2.11.0-RC.1+build", which are fine here).
        check_server_version(str(client._server_info.get("version", "")), url)
    except ServerTooOld:
        await client.close()
        raise
    notify(True)
    return client


