"""The container image runs the control plane: built by `make image` (buildah, no daemon), its
four services run from it against a devcluster and NATS on the host, and a TrainJob submitted
with kubectl gets its JobSet (watcher -> planner, with the planner's admission webhook called by
the API server -> applier).

How the image runs here: `podman run --runtime runc` with a read-only root filesystem, all
capabilities dropped, host network, and process limits set below the VM's hard limits (see
docs/deploy.md: crun refuses this VM's hybrid cgroup layout, and the VM refuses rlimits that are
not lower than its own). Without runc, `buildah run --isolation chroot` runs it instead. Marked
`image`; runs when TRAINYARD_TEST_IMAGE names a built image (`make test-image` builds it).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from trainyard.roles import CLUSTER_ROLES

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TRAINYARD_TEST_IMAGE", "")
STORAGE = ["--storage-driver", "vfs"]
SERVICES = CLUSTER_ROLES

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="set TRAINYARD_TEST_IMAGE to a built image (make test-image)"),
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah not installed (make image-tools)"),
]


def buildah(*args: str, timeout: float = 300) -> str:
    result = subprocess.run(["buildah", *STORAGE, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stderr}"
    return result.stdout.strip()


def test_image_metadata() -> None:
    info = json.loads(buildah("inspect", "--type", "image", IMAGE))
    config = info["OCIv1"]["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["trainyard"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


@pytest.fixture
def container():
    name = f"trainyard-test-{os.getpid()}"
    buildah("from", "--name", name, IMAGE)
    try:
        yield name
    finally:
        subprocess.run(["buildah", *STORAGE, "rm", name], capture_output=True, timeout=120)


def test_no_compiler_no_pip_and_non_root(container: str) -> None:
    out = buildah("run", "--isolation", "chroot", container, "--", "python", "-c",
                  "import os, shutil, importlib.util; print(os.getuid(), shutil.which('gcc'), shutil.which('cc'), "
                  "importlib.util.find_spec('pip'), importlib.util.find_spec('torch'))")
    assert out == "10001 None None None None"


def test_services_from_the_image_turn_a_trainjob_into_a_jobset(container: str, devcluster, nats_server,
                                                                tmp_path: Path) -> None:
    for target in ("crds", "crds/dependencies", "runtimes"):
        devcluster.kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / target), timeout=120)
        if target.startswith("crds"):
            devcluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubeconfig = "/etc/trainyard/kubeconfig"
    # The image's user (uid 10001) must be able to read the mounted kubeconfig (devcluster's is 0600).
    readable = tmp_path / "kubeconfig"
    readable.write_text(devcluster.kubeconfig.read_text())
    readable.chmod(0o644)
    processes: dict[str, subprocess.Popen] = {}
    try:
        for service in SERVICES:
            extra = ["--webhook-port", "0"] if service == "planner" else []
            command = ["trainyard", service, "--kubeconfig", kubeconfig, "--nats-url", nats_server.url,
                       "--http-host", "127.0.0.1", "--http-port", "0", *extra]
            processes[service] = subprocess.Popen(
                runner_argv(f"{container}-{service}", readable, kubeconfig, command),
                stdout=subprocess.PIPE, stderr=(tmp_path / f"{service}.err").open("w"), text=True,
                start_new_session=True)
        urls = {}
        for service, process in processes.items():
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "listening on http://" in line, (service, (tmp_path / f"{service}.err").read_text())
            urls[service] = line.rsplit(" ", 1)[1].strip()
        deadline = time.monotonic() + 90
        for service, url in urls.items():
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (service, (tmp_path / f"{service}.err").read_text()[-3000:])
                time.sleep(0.5)
        # The planner in the image registered its webhook: a bad TrainJob is refused at admission.
        hooks = json.loads(devcluster.kubectl("get", "validatingwebhookconfigurations", "-o", "json").stdout)["items"]
        assert any(h["webhooks"][0]["clientConfig"].get("url", "").startswith("https://127.0.0.1:") for h in hooks)
        devcluster.kubectl("apply", "-k", str(REPO / "examples" / "torch-ddp-cpu"), timeout=60)
        trainjob = next(doc for doc in yaml.safe_load_all(
            (REPO / "examples" / "torch-ddp-cpu" / "trainjob.yaml").read_text()) if doc and doc["kind"] == "TrainJob")
        name, namespace = trainjob["metadata"]["name"], trainjob["metadata"].get("namespace", "default")
        deadline = time.monotonic() + 90
        while True:
            got = devcluster.kubectl("get", "jobsets.jobset.x-k8s.io", name, "-n", namespace, "-o", "json", check=False)
            if got.returncode == 0:
                break
            assert time.monotonic() < deadline, {s: (tmp_path / f"{s}.err").read_text()[-2000:] for s in SERVICES}
            time.sleep(0.5)
        jobset = json.loads(got.stdout)
        assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        managers = json.loads(devcluster.kubectl("get", "jobsets.jobset.x-k8s.io", name, "-n", namespace, "-o", "json",
                                                 "--show-managed-fields").stdout)["metadata"]["managedFields"]
        assert any(m["manager"] == "trainer" for m in managers)
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if PODMAN:
            for service in SERVICES:
                subprocess.run(["podman", *STORAGE, "rm", "-f", "--ignore", f"{container}-{service}"],
                               capture_output=True, timeout=120)


# podman needs runc here (crun cannot handle this VM's cgroups); without it, buildah's chroot.
PODMAN = shutil.which("podman") is not None and shutil.which("runc") is not None
# Below the VM's hard limits (20000 open files here): podman's defaults ask for more.
ULIMITS = ["--ulimit", "nofile=8192:8192", "--ulimit", "nproc=4096:4096"]


def runner_argv(name: str, kubeconfig_file: Path, kubeconfig: str, command: list[str]) -> list[str]:
    if PODMAN:
        return ["podman", *STORAGE, "--runtime", "runc", "run", "--rm", "--name", name, *ULIMITS,
                "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--network", "host", "-v", f"{kubeconfig_file}:{kubeconfig}:ro", "--entrypoint", command[0],
                IMAGE, *command[1:]]
    return ["buildah", *STORAGE, "run", "--isolation", "chroot", "--network", "host",
            "-v", f"{kubeconfig_file}:{kubeconfig}:ro", name.rsplit("-", 1)[0], "--", *command]
