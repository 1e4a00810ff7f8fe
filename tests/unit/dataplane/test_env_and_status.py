"""Pure pod-runner logic: $(VAR) expansion, quantities, env building, phases, conditions."""
from __future__ import annotations


from fractions import Fraction

import pytest

from trainyard_services.devcluster.dataplane.envexpand import expand
from trainyard_services.devcluster.dataplane.podenv import (ContainerConfigError, PodContext,
                                                            container_env, qos_class)
from trainyard_services.devcluster.dataplane.podstatus import (ContainerRecord, pod_conditions,
                                                               pod_phase, stamp_conditions)
from trainyard.apimachinery.quantity import QuantityError, millicores, parse_quantity
from trainyard_services.devcluster.dataplane.restarts import crash_backoff_seconds


@pytest.mark.parametrize("text,expected", [
    ("$(A)", "1"),
    ("x$(A)y$(B)", "x1y2"),
    ("$(UNDEFINED)", "$(UNDEFINED)"),
    ("$$(A)", "$(A)"),
    ("$$", "$"),
    ("$A", "$A"),
    ("$(A", "$(A"),
    ("end$", "end$"),
])
def test_expand(text, expected):
    assert expand(text, {"A": "1", "B": "2"}) == expected


@pytest.mark.parametrize("value,expected", [
    ("500m", Fraction(1, 2)), ("2", 2), ("1Gi", 2 ** 30), ("1e3", 1000),
    (4, 4), ("100M", 10 ** 8), ("250u", Fraction(1, 4000)),
])
def test_parse_quantity(value, expected):
    assert parse_quantity(value).value == expected


def test_bad_quantity_names_the_value():
    with pytest.raises(QuantityError, match="'12x'"):
        parse_quantity("12x")
    assert millicores("250m") == 250 and millicores("1.0001") == 1001


def test_env_order_and_expansion_against_earlier_vars():
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"hostname": "h"}}
    container = {"envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
                 "env": [{"name": "A", "value": "a"}, {"name": "B", "value": "$(A)-$(C)"},
                         {"name": "C", "value": "c"},
                         {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                         {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}}],
                 "resources": {"limits": {"cpu": "1500m"}, "requests": {"memory": "64Mi"}}}
    ctx = PodContext(configmaps={"cm": {"data": {"X": "1"}}})
    env = container_env(pod, container, ctx)
    assert env["CM_X"] == "1" and env["B"] == "a-$(C)" and env["CPU"] == "2" and env["MEM"] == "64"
    assert env["HOSTNAME"] == "h"


@pytest.mark.parametrize("container,message", [
    ({"envFrom": [{"secretRef": {"name": "s"}}]}, 'secret "s" not found'),
    ({"env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]},
     "couldn't find key k in ConfigMap ns/cm"),
])
def test_missing_sources_give_kubelet_messages(container, message):
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    with pytest.raises(ContainerConfigError) as err:
        container_env(pod, container, PodContext(configmaps={"cm": {"data": {}}}))
    assert str(err.value) == message


def test_optional_missing_source_is_skipped():
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    env = container_env(pod, {"envFrom": [{"secretRef": {"name": "s", "optional": True}}]}, PodContext())
    assert "HOSTNAME" in env


def _rec(name, state, code=None, ready=False, will_restart=False):
    return ContainerRecord(name=name, state=state, exit_code=code, ready=ready,
                           ever_started=state != "waiting", will_restart=will_restart)


@pytest.mark.parametrize("policy,init,regular,terminating,phase", [
    ("Never", [], [_rec("a", "waiting")], False, "Pending"),
    ("Never", [_rec("i", "running")], [_rec("a", "waiting")], False, "Pending"),
    ("Never", [_rec("i", "terminated", 1)], [_rec("a", "waiting")], False, "Failed"),
    ("OnFailure", [_rec("i", "terminated", 1)], [_rec("a", "waiting")], False, "Pending"),
    ("Never", [], [_rec("a", "running"), _rec("b", "terminated", 0)], False, "Running"),
    ("Never", [], [_rec("a", "terminated", 0), _rec("b", "terminated", 0)], False, "Succeeded"),
    ("Never", [], [_rec("a", "terminated", 2), _rec("b", "terminated", 0)], False, "Failed"),
    ("OnFailure", [], [_rec("a", "terminated", 2, will_restart=True)], False, "Running"),
    ("OnFailure", [], [_rec("a", "terminated", 143)], True, "Failed"),
    ("Never", [], [_rec("a", "waiting")], True, "Failed"),
])
def test_phase(policy, init, regular, terminating, phase):
    assert pod_phase(policy, init, regular, terminating) == phase


def test_conditions_reasons_and_transition_times():
    running = pod_conditions("Running", [], [_rec("node", "running", ready=False), _rec("side", "running", ready=True)], True)
    by_type = {c["type"]: c for c in running}
    assert by_type["Ready"] == {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                                "message": "containers with unready status: [node]"}
    done = pod_conditions("Succeeded", [], [_rec("node", "terminated", 0)], True)
    by_type = {c["type"]: c for c in done}
    assert by_type["Initialized"]["reason"] == "PodCompleted"
    assert by_type["ContainersReady"] == {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"}
    assert by_type["PodReadyToStartContainers"]["status"] == "False"
    first = stamp_conditions([{"type": "Ready", "status": "False"}], None, "t1")
    same = stamp_conditions([{"type": "Ready", "status": "False", "reason": "x"}], first, "t2")
    moved = stamp_conditions([{"type": "Ready", "status": "True"}], same, "t3")
    assert same[0]["lastTransitionTime"] == "t1" and moved[0]["lastTransitionTime"] == "t3"


def test_qos_and_backoff():
    assert qos_class({"spec": {"containers": [{}]}}) == "BestEffort"
    assert qos_class({"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}) == "Guaranteed"
    assert qos_class({"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}) == "Burstable"
    assert [crash_backoff_seconds(n, 1.0) for n in (1, 2, 3, 4, 10)] == [0, 10, 20, 40, 300]
