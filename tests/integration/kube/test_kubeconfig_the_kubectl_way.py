"""The resolver against real servers: a merged KUBECONFIG and --context reach the devcluster,
in the client and in a real service process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from trainyard.kube.client import KubeClient


def unreachable_kubeconfig(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "nobody", "user": {"token": "x"}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
    }))
    return path


async def test_merged_kubeconfig_and_context_reach_the_cluster(devcluster, tmp_path, monkeypatch) -> None:
    first = unreachable_kubeconfig(tmp_path / "first")
    context = yaml.safe_load(devcluster.kubeconfig.read_text())["current-context"]
    monkeypatch.delenv("TRAINYARD_KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(first), str(devcluster.kubeconfig)]))
    current = await KubeClient.from_kubeconfig(None)
    try:
        assert not await current.ping()  # the first file's current-context wins: unreachable
    finally:
        await current.close()
    chosen = await KubeClient.from_kubeconfig(None, context)
    try:
        assert await chosen.ping()
    finally:
        await chosen.close()


def test_a_service_uses_kubeconfig_env_and_context(devcluster, nats_server, tmp_path) -> None:
    first = unreachable_kubeconfig(tmp_path / "first")
    context = yaml.safe_load(devcluster.kubeconfig.read_text())["current-context"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["KUBECONFIG"] = os.pathsep.join([str(first), str(devcluster.kubeconfig)])
    env["HOME"] = str(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "watcher", "--context", context, "--nats-url", nats_server.url,
         "--http-port", "0", "--cluster", "kubeconfig-test"],
        env=env, stdout=subprocess.PIPE, stderr=(tmp_path / "watcher.err").open("w"), text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "listening on http://" in line, (tmp_path / "watcher.err").read_text()
        url = line.rsplit(" ", 1)[1].strip()
        deadline = time.monotonic() + 30
        ready = None
        while time.monotonic() < deadline:
            ready = httpx.get(f"{url}/readyz")
            if ready.status_code == 200:
                break
            time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, (ready and ready.text, (tmp_path / "watcher.err").read_text())
    finally:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_service_without_any_cluster_configuration_says_so_in_one_line(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRAINYARD_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    result = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "applier", "--http-port", "0"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "error: no cluster configuration: give --kubeconfig, set KUBECONFIG, create ~/.kube/config" \
        in result.stderr
    assert "Traceback" not in result.stderr
    wrong = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "applier", "--http-port", "0",
                            "--kubeconfig", str(unreachable_kubeconfig(tmp_path / "k")), "--context", "other"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "--context other: no such context" in wrong.stderr, wrong.stderr
