"""Every API-server integration test here runs against one devcluster process and against
4 API workers over one store process (``devcluster up --api-workers 4``).

``api_workers`` is a module-scoped parameter (1, then 4): pytest groups a module's tests by it,
so each module starts one devcluster per worker count, not one per test. The ``devcluster`` and
``devcluster_module`` fixtures below take it; a module that starts its own devcluster passes
``api_workers_args(api_workers)``. A test that starts no devcluster of its own and asks for none
runs once.

With 4 workers, ``Devcluster.http_limits`` makes an httpx client open a new connection per
request, so the kernel (SO_REUSEPORT) spreads one test's requests over the workers: a write
through one worker is read, watched and enforced (RBAC, admission configuration, CRDs) through
the others, as clients of a multi-worker devcluster see it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from fixtures.devcluster import Devcluster, api_workers_args, start_devcluster

API_WORKERS = (1, 4)


@pytest.fixture(scope="module", params=API_WORKERS,
                ids=lambda n: "1-api-worker" if n == 1 else f"{n}-api-workers")
def api_workers(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture(scope="module")
def devcluster_module(tmp_path_factory: pytest.TempPathFactory, api_workers: int) -> Iterator[Devcluster]:
    cluster = start_devcluster(tmp_path_factory.mktemp("devcluster") / "data", api_workers_args(api_workers))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def devcluster(tmp_path: Path, api_workers: int) -> Iterator[Devcluster]:
    cluster = start_devcluster(tmp_path / "devcluster", api_workers_args(api_workers))
    try:
        yield cluster
    finally:
        cluster.stop()
