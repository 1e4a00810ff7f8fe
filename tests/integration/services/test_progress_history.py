"""The progress history (docs/bus.md, ``TY_PROGRESS``) on the bus as `trainyard up` runs it: TLS
and one identity per process. The status endpoint (as the status service's identity) keeps every
report it accepts; the dashboard's identity reads a TrainJob's reports back, oldest first, and
follows new ones; the history is bounded per TrainJob."""
from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import httpx
import pytest

from integration.apiserver._manifests import install_trainer_crds, trainjob
from trainyard.bus.envelopes import ProgressReport, decode
from trainyard.bus.progress import publish_report, read_history
from trainyard.bus.publisher import Publisher
from trainyard.bus.topology import PROGRESS_POINTS
from trainyard.kube.client import KubeClient
from trainyard.pipeline.trainer_status import status_path, token_audience
from trainyard.security import pki
from trainyard_services.status.progress import history_recorder, serve

pytestmark = pytest.mark.timeout(180)


async def connect_as(server, role: str, cluster: str | None = "default"):
    from trainyard.bus.auth import Credentials
    from trainyard.bus.connection import connect

    return await connect(server.url, f"test-{role}",
                         credentials=Credentials.load(server.security.credentials_for(role, cluster)))


async def test_reports_accepted_by_the_endpoint_are_read_back_by_the_dashboard(secure_nats_server, devcluster,
                                                                               tmp_path: Path) -> None:
    install_trainer_crds(devcluster)
    devcluster.kubectl("apply", "-f", "-", input=trainjob("curve", 1))
    uid = json.loads(devcluster.kubectl("get", "trainjob", "curve", "-o", "json").stdout)["metadata"]["uid"]
    token = devcluster.kubectl("create", "token", "default", "--audience",
                               token_audience("default", "curve")).stdout.strip()
    pki.save_bundle(tmp_path, pki.issue(["127.0.0.1"], ca_common_name="progress-history-test"))
    status_nc = await connect_as(secure_nats_server, "status")
    dashboard_nc = await connect_as(secure_nats_server, "dashboard", None)
    client = await KubeClient.from_kubeconfig(str(devcluster.kubeconfig))
    live: list[ProgressReport] = []

    async def follow(msg) -> None:
        live.append(decode(ProgressReport, msg.data))

    await dashboard_nc.subscribe("ty.progress.default.>", cb=follow)
    recorder = history_recorder(Publisher(status_nc.jetstream(), "status"), "default")
    runner = await serve(client, "127.0.0.1", 0, str(tmp_path), on_report=recorder)
    url = f"https://127.0.0.1:{runner.addresses[0][1]}" + status_path("default", "curve")
    losses = ["0.900000", "0.500000", "0.250000"]
    try:
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")),
                                     timeout=10) as http:
            for step, loss in enumerate(losses, start=1):
                answer = await http.post(url, headers={"Authorization": f"Bearer {token}"}, json={"trainerStatus": {
                    "progressPercentage": step * 30, "metrics": [{"name": "loss", "value": loss}],
                    "lastUpdatedTime": f"2026-11-26T06:00:0{step}Z"}})
                assert answer.status_code == 200, answer.text
        history = await read_history(dashboard_nc.jetstream(), "default", "default", "curve", uid=uid)
        assert [(r.progress_percentage, [m.value for m in r.metrics]) for r in history] == \
            [(30, ["0.900000"]), (60, ["0.500000"]), (90, ["0.250000"])]
        assert [r.at for r in history] == sorted(r.at for r in history)
        assert len({r.resource_version for r in history}) == 3 and {r.uid for r in history} == {uid}
        # Another TrainJob of the same name (another uid) does not inherit the curve.
        assert await read_history(dashboard_nc.jetstream(), "default", "default", "curve", uid="other") == []
        # The same report published again (a retry) is stored once.
        await publish_report(Publisher(status_nc.jetstream(), "status"), history[-1])
        assert len(await read_history(dashboard_nc.jetstream(), "default", "default", "curve")) == 3
        for _ in range(100):
            if len(live) == 4:
                break
            await asyncio.sleep(0.05)
        # Subscribers see every publication, the retry too (the stream's dedup stores it once):
        # readers tell reports apart by resourceVersion.
        assert [r.resource_version for r in live] == [r.resource_version for r in history] + \
            [history[-1].resource_version]
    finally:
        await runner.cleanup()
        await client.close()
        await status_nc.close()
        await dashboard_nc.close()
    violations = [line for line in secure_nats_server.log_path.read_text().splitlines() if "Violation" in line]
    assert violations == []


async def test_the_history_keeps_the_last_reports_of_each_trainjob(nats_server) -> None:
    from trainyard.bus.session import BusSession

    bus = await BusSession.open(nats_server.url, "test")
    try:
        def report(name: str, index: int) -> ProgressReport:
            return ProgressReport(cluster="default", namespace="default", name=name, uid=f"uid-{name}",
                                  resourceVersion=str(index), at=float(index), progressPercentage=index % 101)

        for index in range(PROGRESS_POINTS + 5):
            await publish_report(bus.publisher, report("long", index))
        await publish_report(bus.publisher, report("short", 1))
        long = await read_history(bus.js, "default", "default", "long")
        assert len(long) == PROGRESS_POINTS
        assert (long[0].resource_version, long[-1].resource_version) == ("5", str(PROGRESS_POINTS + 4))
        assert [r.resource_version for r in await read_history(bus.js, "default", "default", "short")] == ["1"]
    finally:
        await bus.close()
