"""A non-editable install works without the checkout: the wheel carries deploy/ and examples/.

The wheel is built from this checkout (`pip wheel --no-deps --no-build-isolation`), installed
with `--no-deps --no-index` into a fresh venv outside the checkout; its dependencies come from
this test's own environment through a .pth line placed after the venv's own site-packages (so
the test runs offline and in seconds, and the package itself is the wheel's copy, never the
checkout's). Then `trainyard up --free-ports` from a temporary directory must reach ready with
the default runtimes installed, and `trainyard down` must stop it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from fixtures.checkout import copy_checkout

REPO = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"

pytestmark = pytest.mark.slow


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{argv} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh venv holding the wheel built from this checkout."""
    work = tmp_path_factory.mktemp("packaging")
    wheels = work / "wheels"
    # Built from a copy: an in-tree build would leave build/ in the shared checkout.
    source = copy_checkout(work / "source")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels, source,
         cwd=work)
    (wheel,) = wheels.glob("trainyard-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    bin_dir = venv / "bin"
    purelib = Path(subprocess.run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    _run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--no-deps", "--no-index", "--quiet",
         wheel, cwd=work)
    # Dependencies: this environment's site-packages, after the venv's own (where trainyard is).
    (purelib / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return bin_dir


def _env(bin_dir: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "KUBECONFIG"))}
    # The dependencies' executables (nats-server, kubectl) as a pip install would put them on PATH.
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["HOME"] = str(home)
    env.pop("PYTHONPATH", None)
    return env


def test_wheel_is_self_contained(installed: Path, tmp_path: Path) -> None:
    env = _env(installed, tmp_path)
    where = _run(installed / "python", "-c",
                 "import trainyard, trainyard_services, trainyard.packaged as p; "
                 "print(trainyard.__file__); print(trainyard_services.__file__); print(p.deploy_dir()); "
                 "print(p.examples_dir()); print(p.checkout_dir())", cwd=tmp_path, env=env).splitlines()
    venv = installed.parent
    for line in where[:4]:
        assert Path(line).is_relative_to(venv), where
    assert where[4] == "None"
    deploy = Path(where[2])
    assert (deploy / "runtimes" / "kustomization.yaml").is_file()
    assert (deploy / "crds" / "kustomization.yaml").is_file()
    assert (deploy / "kustomization.yaml").is_file()
    assert (Path(where[3]) / "torch-ddp-cpu" / "trainjob.yaml").is_file()
    assert _run(installed / "trainyard", "--version", cwd=tmp_path, env=env).strip() == "trainyard 0.1.0"
    assert "demo" in _run(installed / "trainyard", "--help", cwd=tmp_path, env=env)
    # The wheel declares what the control plane imports, and never torch nor pyroute2.
    requires = _run(installed / "python", "-c",
                    "import importlib.metadata as m; print('\\n'.join(m.requires('trainyard')))",
                    cwd=tmp_path, env=env).splitlines()
    plain = {r.split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in requires if "extra ==" not in r}
    assert {"aiohttp", "kubernetes-validate", "nats-py", "kubernetes_asyncio"} <= plain
    assert "torch" not in plain and "pyroute2" not in plain
    assert any(r.startswith("torch") and 'extra == "examples"' in r for r in requires)
    assert "kubernetes-validate>=1.36.0" in requires
    license_text = _run(installed / "python", "-c",
                        "import importlib.metadata as m; print(m.metadata('trainyard')['License-Expression'])",
                        cwd=tmp_path, env=env)
    assert license_text.strip() == "Apache-2.0"


def test_up_from_installed_wheel_reaches_ready(installed: Path, tmp_path: Path) -> None:
    from trainyard.supervisor.proctable import descendants

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = _env(installed, tmp_path)
    out = (cwd / "up.out").open("w")
    process = subprocess.Popen([str(installed / "trainyard"), "up", "--free-ports", "--data-dir", "tmp"],
                               cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    seen: dict[int, int | None] = {}
    try:
        state_file = cwd / "tmp" / "stack.json"
        deadline = time.monotonic() + 180
        state: dict = {}
        while time.monotonic() < deadline:
            assert process.poll() is None, (cwd / "up.out").read_text()
            try:
                state = json.loads(state_file.read_text())
            except (FileNotFoundError, ValueError):
                state = {}
            if state.get("ready"):
                break
            time.sleep(0.3)
        assert state.get("ready"), (cwd / "up.out").read_text()
        for child in descendants(process.pid):
            seen[child.pid] = child.start_time
        # The services run from the installed package, and its hints point into it, not the checkout.
        said = (cwd / "up.out").read_text()
        assert f"{REPO}/examples" not in said and f"{REPO}/deploy" not in said, said
        assert "site-packages/trainyard/_data/examples/torch-ddp-cpu" in said, said
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in seen]
        services = [argv for argv in commands if b"trainyard.cli.main" in argv and any(
            name in argv for name in (b"watcher", b"planner", b"applier", b"status"))]
        # watcher, applier, status and the two planner replicas (--planner-replicas default 2)
        roles = sorted(next(n for n in (b"watcher", b"planner", b"applier", b"status") if n in argv).decode()
                       for argv in services)
        assert roles == ["applier", "planner", "planner", "status", "watcher"], commands
        assert all(argv[0].decode().startswith(str(installed)) for argv in services), services
        runtimes = _run(KUBECTL, "--kubeconfig", cwd / "tmp" / "kubeconfig", "get", "clustertrainingruntimes",
                        "-o", "name", cwd=cwd, env=env)
        assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in runtimes
        assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed-cpu" in runtimes
        crds = _run(KUBECTL, "--kubeconfig", cwd / "tmp" / "kubeconfig", "get", "crds", "-o", "name", cwd=cwd, env=env)
        assert "trainjobs.trainer.kubeflow.org" in crds
        _run(installed / "trainyard", "down", "--data-dir", "tmp", cwd=cwd, env=env, timeout=120)
        process.wait(timeout=60)
        assert process.returncode == 0, (cwd / "up.out").read_text()
    finally:
        from trainyard.supervisor.proctable import ProcessId

        for pid, start in seen.items():
            if ProcessId(pid, start).is_alive():
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
    assert not [pid for pid, start in seen.items() if ProcessId(pid, start).is_alive()]
