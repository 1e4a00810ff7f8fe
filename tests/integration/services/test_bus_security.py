"""The authenticated bus (docs/security.md): a real nats-server with TLS and one NKey user per
service identity, each granted exactly its subjects; the topology made by the bootstrap
identity. Anonymous clients are refused; every identity is refused what it must not do (by
NATS itself, not by our code); and the four services, each with its own identity, take an
MPI TrainJob through to its JobSet and status without one permission violation."""
from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import nats
import pytest
import yaml

from integration.services.conftest import CTR, JOBSETS, TRAINJOBS, Stack, install_crds, wait_for

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[3]


def creds(server, role: str, cluster: str | None = "default"):
    from trainyard.bus.auth import Credentials

    return Credentials.load(server.security.credentials_for(role, cluster))


async def connect_as(server, role: str | None, cluster: str | None = "default", errors: list | None = None):
    """A raw nats-py client as ``role`` (None: anonymous, trusting the CA)."""
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    ca = creds(server, "bootstrap").ca_pem
    options = dict(tls=ssl.create_default_context(cadata=ca), allow_reconnect=False, connect_timeout=3,
                   max_reconnect_attempts=0, error_cb=on_error)
    if role is not None:
        identity = creds(server, role, cluster)
        options.update(nkeys_seed_str=identity.seed, inbox_prefix=identity.inbox_prefix)
    return await nats.connect(server.url, **options)


def test_anonymous_and_plain_clients_are_refused(secure_nats_server) -> None:
    async def main() -> None:
        with pytest.raises(Exception, match="Authorization Violation"):
            await connect_as(secure_nats_server, None)
        with pytest.raises(Exception):  # no TLS: the server requires it
            await nats.connect(f"nats://127.0.0.1:{secure_nats_server.port}", allow_reconnect=False,
                               connect_timeout=3, max_reconnect_attempts=0)

    asyncio.run(main())


# (identity, cluster, subject it must not publish to)
FORBIDDEN_PUBLISH = [
    ("watcher", "default", "ty.desired.default.p0.TrainJob.default.forged"),  # a forged plan
    ("watcher", "default", "ty.results.default.p0.TrainJob.default.forged"),
    ("watcher", "default", "ty.events.other.p0.TrainJob.default.x"),  # another cluster's events
    ("watcher", "default", "$KV.ty_applied.default.default.x"),
    ("watcher", "default", "$JS.API.STREAM.CREATE.EVIL"),
    ("watcher", "default", "$JS.API.STREAM.DELETE.TY_EVENTS"),
    ("planner", "default", "ty.events.default.p0.TrainJob.default.x"),
    ("planner", "default", "$KV.ty_objects.default.TrainJob.default.x"),
    ("planner", "default", "$JS.API.CONSUMER.CREATE.TY_PLANS.applier-p0_default"),
    ("planner", "default", "$KV.ty_leases.applier.default.p.0"),  # another role's lease
    ("planner", "default", "$KV.ty_members.planner.default.m.x"),  # the members bucket: presences only
    ("planner", "default", "$JS.API.CONSUMER.CREATE.KV_ty_members.m-x.$KV.ty_members.applier.default.m.x"),
    ("planner", "default", "$JS.API.CONSUMER.MSG.NEXT.TY_EVENTS.status-p0_default"),
    ("applier", "default", "ty.desired.default.p0.TrainJob.default.x"),
    ("applier", "default", "ty.desired.other.p0.TrainJob.default.x"),
    ("applier", "default", "$JS.API.CONSUMER.MSG.NEXT.TY_PLANS.applier-p0_other"),  # another cluster's plans
    ("applier", "default", "$KV.ty_leases.applier.other.p.0"),  # another cluster's leases
    ("applier", "default", "$KV.ty_applied.other.default.x"),
    ("applier", "default", "$JS.API.STREAM.PURGE.TY_PLANS"),
    ("status", "default", "ty.results.default.p0.TrainJob.default.x"),
    ("status", "default", "$KV.ty_outcomes.default.default.x"),
    ("status", "default", "ty.progress.other.TrainJob.default.x"),  # another cluster's progress
    ("watcher", "default", "ty.progress.default.TrainJob.default.forged"),  # progress: the status endpoint's
    ("dispatcher", None, "ty.desired.default.p0.TrainJob.default.x"),
    ("dispatcher", None, "$KV.ty_objects.default.TrainJob.default.x"),
    ("dashboard", None, "ty.events.default.p0.TrainJob.default.x"),
    ("dashboard", None, "$JS.API.CONSUMER.DELETE.TY_PLANS.applier_default"),
    ("dashboard", None, "ty.progress.default.TrainJob.default.forged"),  # reads progress, never writes it
    ("dashboard", None, "$JS.API.CONSUMER.CREATE.TY_PROGRESS.x.ty.progress.elsewhere.>"),  # only its clusters
]
FORBIDDEN_SUBSCRIBE = [
    ("watcher", "default", "ty.events.>"),
    ("applier", "default", "ty.desired.>"),  # plans are pulled through its consumer only
    ("planner", "default", "_INBOX_applier-default.>"),  # another identity's replies
    ("status", "default", "$KV.>"),
    ("status", "default", "ty.progress.>"),  # it publishes progress; the dashboard reads it
]


def test_each_identity_is_refused_outside_its_subjects(secure_nats_server) -> None:
    async def refused_publish(role, cluster, subject) -> bool:
        errors: list[str] = []
        nc = await connect_as(secure_nats_server, role, cluster, errors)
        try:
            await nc.publish(subject, b"{}")
            await nc.flush()
            deadline = time.monotonic() + 3
            while not errors and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            await nc.close()
        return any("permissions violation for publish" in e for e in errors)

    async def refused_subscribe(role, cluster, subject) -> bool:
        errors: list[str] = []
        nc = await connect_as(secure_nats_server, role, cluster, errors)
        try:
            await nc.subscribe(subject)
            await nc.flush()
            deadline = time.monotonic() + 3
            while not errors and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            await nc.close()
        return any("permissions violation for subscription" in e for e in errors)

    async def main() -> None:
        allowed_publish = [(role, cluster, subject) for role, cluster, subject in FORBIDDEN_PUBLISH
                           if not await refused_publish(role, cluster, subject)]
        allowed_subscribe = [(role, cluster, subject) for role, cluster, subject in FORBIDDEN_SUBSCRIBE
                             if not await refused_subscribe(role, cluster, subject)]
        assert (allowed_publish, allowed_subscribe) == ([], [])
        # The check can tell: what the watcher may do goes through.
        assert not await refused_publish("watcher", "default", "ty.events.default.TrainJob.default.x")
        assert not await refused_subscribe("applier", "default", "_INBOX_applier-default.>")

    asyncio.run(main())


def test_a_forged_plan_from_the_watcher_is_refused_by_nats(secure_nats_server) -> None:
    from trainyard.bus.topology import PLANS_STREAM

    async def main() -> None:
        watcher = await connect_as(secure_nats_server, "watcher")
        try:
            with pytest.raises(Exception):  # no ack: the server dropped it
                await watcher.jetstream().publish("ty.desired.default.TrainJob.default.forged", b'{"objects": []}',
                                                  timeout=2)
        finally:
            await watcher.close()
        admin = await connect_as(secure_nats_server, "bootstrap", None)
        try:
            info = await admin.jetstream().stream_info(PLANS_STREAM)
            assert info.state.messages == 0 and info.state.last_seq == 0
        finally:
            await admin.close()

    asyncio.run(main())


def test_services_each_with_its_own_identity_run_an_mpi_trainjob(secure_nats_server, devcluster, tmp_path,
                                                                 api, monkeypatch) -> None:
    install_crds(devcluster)
    stack = Stack(secure_nats_server, devcluster, tmp_path)
    try:
        stack.start_all()
        runtime = yaml.safe_load((REPO / "deploy" / "runtimes" / "mlx-distributed.yaml").read_text())
        # One left by v2.1.0 behaviour: the status service removes it (v2.3.0).
        runtime["metadata"]["finalizers"] = ["trainer.kubeflow.org/resource-in-use"]
        api.create(CTR, runtime)
        api.create(TRAINJOBS.format(ns="default"), {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "secured", "namespace": "default"},
            "spec": {"runtimeRef": {"name": "mlx-distributed"}, "suspend": True,
                     "trainer": {"numNodes": 2, "command": ["mpirun", "true"]}}})
        wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/secured"), what="JobSet")
        wait_for(lambda: api.get("/api/v1/namespaces/default/secrets/secured-mpi-ssh-auth"), what="MPI Secret")
        # The status service's writes: the Suspended condition, the runtime's in-use finalizer removed.
        wait_for(lambda: any(c["type"] == "Suspended" for c in (api.get(TRAINJOBS.format(ns="default") + "/secured")
                                                                or {}).get("status", {}).get("conditions", [])),
                 what="Suspended condition")
        wait_for(lambda: "trainer.kubeflow.org/resource-in-use" not in
                 (api.get(CTR + "/mlx-distributed")["metadata"].get("finalizers") or []), what="finalizer removed")
    finally:
        stack.stop_all()
    log = secure_nats_server.log_path.read_text()
    violations = [line for line in log.splitlines() if "Violation" in line]
    assert violations == []
    assert "authentication error" not in log
