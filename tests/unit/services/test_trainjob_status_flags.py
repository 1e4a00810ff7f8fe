"""The TrainJobStatus flags of the planner and the status service: off by default, refused
when incomplete, and the planner's plugins gain TrainJobStatus before the JobSet builder."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from trainyard.pipeline.plugins import REGISTRY
from trainyard_services.planner.main import _plugins
from trainyard.errors import UserError
from trainyard.host.service import port_or_off


class Refused(Exception):
    pass


def args(**values: str | None) -> argparse.Namespace:
    return argparse.Namespace(trainjob_status_url=values.get("url"), trainjob_status_ca_file=values.get("ca"))


def test_off_by_default_the_planner_plans_with_the_registry() -> None:
    assert _plugins(args(), Refused) is REGISTRY


def test_on_the_planner_adds_trainjob_status_before_the_jobset_builder(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    plugins = _plugins(args(url="https://trainyard-status.kubeflow-system.svc:8443", ca=str(tmp_path / "ca.crt")),
                       Refused)
    assert [p.name for p in plugins][-2:] == ["TrainJobStatus", "JobSet"]


@pytest.mark.parametrize("values, message", [
    ({"url": "http://x:1"}, "must start with https://"),
    ({"url": "https://x:1"}, "needs --trainjob-status-ca-file"),
    ({"url": "https://x:1", "ca": "/nonexistent/ca.crt"}, "--trainjob-status-ca-file"),
])
def test_incomplete_planner_flags_are_refused(values: dict, message: str) -> None:
    with pytest.raises(Refused, match=message):
        _plugins(args(**values), Refused)


def test_port_flags_that_take_off() -> None:
    assert port_or_off("off", "--trainjob-status-port") is None
    assert port_or_off("8443", "--trainjob-status-port") == 8443
    with pytest.raises(UserError, match="--trainjob-status-port: expected a port number or 'off'"):
        port_or_off("https", "--trainjob-status-port")
    with pytest.raises(UserError, match="--webhook-port: must be between 0 and 65535"):
        port_or_off("70000", "--webhook-port")


def test_the_ca_configmap_being_created_does_not_replan_a_plan_still_being_applied() -> None:
    """It is applied before the JobSet: re-planning on its ADDED event would re-apply the plan
    under the ConfigMap's trace. Its deletion still re-plans (it is re-created)."""
    from trainyard.bus.envelopes import ObjectEvent
    from trainyard_services.planner.reconcile import child_event_changes_nothing

    trainjob = {"metadata": {"name": "mnist", "uid": "u", "generation": 1}, "spec": {}}

    def event(kind: str, name: str, type_: str = "ADDED") -> ObjectEvent:
        return ObjectEvent(cluster="default", type=type_, kind=kind, apiVersion="v1", namespace="default",
                           name=name, object={"metadata": {"name": name}})
    assert child_event_changes_nothing(event("ConfigMap", "mnist-tls-config"), trainjob, None)
    assert not child_event_changes_nothing(event("ConfigMap", "mnist-tls-config", "DELETED"), trainjob, None)
    assert not child_event_changes_nothing(event("ConfigMap", "mnist-mpi-hostfile"), trainjob, None)


def test_a_jobset_appearing_while_its_plan_is_applied_does_not_replan() -> None:
    """The JobSet's ADDED event can arrive before the applier records the plan as applied:
    while the claim on this generation is live, it changes nothing (a mismatching suspend, a
    deletion, an expired claim or another generation still re-plan)."""
    import time

    from trainyard.bus.envelopes import ObjectEvent
    from trainyard.bus.kv import AppliedPlan
    from trainyard_services.planner.reconcile import child_event_changes_nothing

    trainjob = {"metadata": {"name": "mnist", "uid": "u", "generation": 2}, "spec": {}}

    def jobset(type_: str = "ADDED", suspend: bool = False) -> ObjectEvent:
        return ObjectEvent(cluster="default", type=type_, kind="JobSet", apiVersion="jobset.x-k8s.io/v1alpha2",
                           namespace="default", name="mnist",
                           object={"metadata": {"name": "mnist"}, "spec": {"suspend": suspend}})

    def entry(state: str, generation: int = 2, expires_in: float = 30.0) -> AppliedPlan:
        return AppliedPlan(uid="u", generation=generation, planHash="h", state=state,
                           claimExpires=time.time() + expires_in)

    assert child_event_changes_nothing(jobset(), trainjob, entry("applying"))
    assert child_event_changes_nothing(jobset(), trainjob, entry("applied"))
    assert not child_event_changes_nothing(jobset(), trainjob, entry("applying", expires_in=-1))
    assert not child_event_changes_nothing(jobset(), trainjob, entry("applying", generation=1))
    assert not child_event_changes_nothing(jobset(suspend=True), trainjob, entry("applying"))
    assert not child_event_changes_nothing(jobset("DELETED"), trainjob, entry("applying"))
