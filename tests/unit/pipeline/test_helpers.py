"""Quantities, pod requests and keyed upserts (spec §3.4, §4.1.1, §4.9)."""
from __future__ import annotations

from typing import Any

import pytest

from trainyard.pipeline.errors import aggregate_message
from trainyard.apimachinery.quantity import QuantityError, parse_quantity, render_quantity
from trainyard.pipeline.resources import cpu_count, gpu_count, single_pod_requests
from trainyard.pipeline.upsert import upsert_env, upsert_port, upsert_volume_mount


@pytest.mark.parametrize("parts, expected", [
    (["250m", "500m", "500m"], "1250m"),
    (["1Gi", "512Mi", "512Mi", "512Mi", "512Mi"], "3Gi"),
    (["4Gi"] * 102, "408Gi"),
    ([1] * 102, "102"),
    (["300m", "500m", "500m", "500m", "500m"], "2300m"),
    (["1k", "1"], "1001"),
    (["0.5"], "500m"),
    (["1500Mi"], "1500Mi"),
])
def test_quantity_sums_render_canonically(parts: list[Any], expected: str) -> None:
    total = parse_quantity(parts[0])
    for part in parts[1:]:
        total = total + parse_quantity(part)
    assert render_quantity(total) == expected


@pytest.mark.parametrize("raw", ["abc", "1.2.3", "", [], True, "5Xi"])
def test_bad_quantities_are_rejected(raw: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(raw)


@pytest.mark.parametrize("resources, gpus, cpus", [
    ({"requests": {"nvidia.com/gpu": 2}}, 2, 0),
    ({"limits": {"AMD.com/GPU": "3"}}, 3, 0),
    ({"requests": {"cpu": "2.5"}}, 0, 3),
    ({"requests": {"cpu": 0}, "limits": {"cpu": "3700m"}}, 0, 4),
    (None, 0, 0),
])
def test_gpu_and_cpu_counts(resources: Any, gpus: int, cpus: int) -> None:
    assert (gpu_count(resources), cpu_count(resources)) == (gpus, cpus)


def test_pod_requests_add_sidecars_and_take_init_peak_and_overhead() -> None:
    pod = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "10", "memory": "1Gi"}}}],
           "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "5"}}},
                              {"name": "big", "resources": {"requests": {"memory": "8Gi"}}}],
           "overhead": {"cpu": "100m"}}
    requests = {name: render_quantity(q) for name, q in single_pod_requests(pod).items()}
    assert requests == {"cpu": "15100m", "memory": "8Gi"}


def test_pod_level_requests_win() -> None:
    pod = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "10", "memory": "1Gi"}}}],
           "resources": {"requests": {"cpu": "2"}}}
    requests = {name: render_quantity(q) for name, q in single_pod_requests(pod).items()}
    assert requests == {"cpu": "2", "memory": "1Gi"}


def test_env_upsert_replaces_in_place() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    upsert_env(env, {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}})
    upsert_env(env, {"name": "C", "value": "3"})
    assert env == [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}, {"name": "B", "value": "2"},
                   {"name": "C", "value": "3"}]


def test_volume_mount_upsert_matches_by_mount_path() -> None:
    mounts = [{"name": "vol1", "mountPath": "/data"}, {"name": "vol2", "mountPath": "/other"}]
    upsert_volume_mount(mounts, {"name": "vol3", "mountPath": "/data", "readOnly": True})
    assert mounts == [{"name": "vol3", "mountPath": "/data", "readOnly": True}, {"name": "vol2", "mountPath": "/other"}]


@pytest.mark.parametrize("ports, new, expected", [
    pytest.param([{"containerPort": 8080}], {"containerPort": 9090},
                 [{"containerPort": 8080}, {"containerPort": 9090}], id="unnamed-ports-are-distinct"),
    pytest.param([{"containerPort": 9090, "protocol": "UDP"}], {"containerPort": 9090},
                 [{"containerPort": 9090}], id="same-port-replaced"),
    pytest.param([{"containerPort": 1, "name": "http"}], {"containerPort": 2, "name": "http"},
                 [{"containerPort": 2, "name": "http"}], id="same-name-replaced"),
])
def test_port_upsert(ports: list[dict], new: dict, expected: list[dict]) -> None:
    upsert_port(ports, new)
    assert ports == expected


@pytest.mark.parametrize("texts, message", [
    (["a"], "a"), (["a", "a"], "a"), (["a", "b", "a"], "[a, b]"),
])
def test_aggregate_like_kubernetes(texts: list[str], message: str) -> None:
    assert aggregate_message(texts) == message
