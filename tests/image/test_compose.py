"""docker-compose.yml: parsed and resolved by podman-compose (Debian's), and what it must hold."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("watcher", "planner", "applier", "status")


def test_compose_file_builds_from_the_dockerfile_with_healthchecks() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"nats", *SERVICES}
    for name in SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert service["build"]["args"]["BASE"] == "${TRAINYARD_BASE:-python:3.11-slim}"
        assert "/readyz" in " ".join(service["healthcheck"]["test"])
        assert service["read_only"] is True and service["user"] == "10001:10001"
        assert service["depends_on"]["nats"]["condition"] == "service_healthy"
        assert service["command"] == [name]  # the image's entrypoint is `trainyard`
    assert "healthz" in " ".join(services["nats"]["healthcheck"]["test"])
    assert "TRAINYARD_WEBHOOK_URL" in services["planner"]["environment"]


@pytest.mark.skipif(shutil.which("podman-compose") is None, reason="podman-compose not installed (make image-tools)")
def test_podman_compose_resolves_the_file(tmp_path: Path) -> None:
    # Debian bookworm's podman-compose (1.0.3) has no `config`; `--dry-run ps` parses, merges the
    # anchors and interpolates the whole file, and runs nothing.
    result = subprocess.run(["podman-compose", "--dry-run", "-f", str(REPO / "docker-compose.yml"), "ps"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((REPO / "docker-compose.yml").read_text().replace("<<: *service", "<<: *nowhere", 1))
    bad = subprocess.run(["podman-compose", "--dry-run", "-f", str(broken), "ps"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode != 0
