"""Mount targets the kubelet creates on the host (services/devcluster/dataplane/volumes.py) are
counted across every kubelet of the machine: a manager and its workers, or two test processes,
share one host tree. Seen: 1 of 80 delegated TrainJobs Failed (`trainyard up --workers 2`, a
loaded machine) because its pod's `mount --bind ... /var/run/secrets/kubeflow/trainer` found no
mount point: another devcluster's kubelet had removed the directory when its own last pod using
it stopped. The same removal, made while a pod runs, detaches that pod's bind mount (Linux drops
the mounts of a directory removed in another mount namespace): a running trainer lost its
projected token, its progress reports failed, and the dashboard's timeline showed a suspension
without its step (test_preemption, twice in loaded runs of the suite)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainyard_services.devcluster.dataplane import volumes
from trainyard_services.devcluster.dataplane.volumes import MountpointRegistry


@pytest.fixture(autouse=True)
def shared_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setattr(volumes, "MOUNTPOINTS_DIR", state, raising=False)
    return state


def test_a_target_stays_while_another_kubelet_still_holds_it(tmp_path: Path) -> None:
    target = str(tmp_path / "host" / "var" / "run" / "secrets" / "kubeflow" / "trainer")
    manager, worker = MountpointRegistry(), MountpointRegistry()  # two devclusters' kubelets
    manager.acquire(target, is_file=False)
    assert Path(target).is_dir()
    worker.acquire(target, is_file=False)  # found existing
    manager.release(target)                # the manager's last pod stops
    assert Path(target).is_dir(), "removed while another kubelet's pod still binds it"
    worker.release(target)
    assert not (tmp_path / "host" / "var").exists(), "what was created for pods is removed after the last"


def test_one_kubelet_counts_its_own_pods(tmp_path: Path) -> None:
    target = str(tmp_path / "host" / "etc" / "config.yaml")
    kubelet = MountpointRegistry()
    kubelet.acquire(target, is_file=True)
    kubelet.acquire(target, is_file=True)
    kubelet.release(target)
    assert Path(target).is_file()
    kubelet.release(target)
    assert not (tmp_path / "host" / "etc").exists()


def test_a_target_that_was_there_before_is_never_removed(tmp_path: Path) -> None:
    existing = tmp_path / "host" / "data"
    existing.mkdir(parents=True)
    kubelet = MountpointRegistry()
    kubelet.acquire(str(existing), is_file=False)
    kubelet.release(str(existing))
    assert existing.is_dir()


def test_a_killed_kubelets_hold_does_not_keep_a_target_forever(tmp_path: Path, shared_state: Path) -> None:
    target = str(tmp_path / "host" / "var" / "lib" / "thing")
    # A kubelet process that acquires and dies without releasing (a killed devcluster).
    script = (f"from pathlib import Path; from trainyard_services.devcluster.dataplane import volumes as v; "
              f"v.MountpointRegistry(Path({str(shared_state)!r})).acquire({target!r}, is_file=False)")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert Path(target).is_dir()
    kubelet = MountpointRegistry()
    kubelet.acquire(target, is_file=False)
    kubelet.release(target)
    assert not (tmp_path / "host" / "var").exists(), "the dead holder's targets go with the last live one"


def test_kubelets_in_two_processes_share_the_count(tmp_path: Path, shared_state: Path) -> None:
    target = str(tmp_path / "host" / "run" / "secrets" / "token")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from trainyard_services.devcluster.dataplane import volumes as v; "
         f"r = v.MountpointRegistry(Path({str(shared_state)!r})); r.acquire({target!r}, is_file=False); "
         "print('held', flush=True); sys.stdin.readline(); r.release(" + repr(target) + ")"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        kubelet = MountpointRegistry()
        kubelet.acquire(target, is_file=False)
        kubelet.release(target)
        assert Path(target).is_dir(), "removed while the other process's pod holds it"
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert not (tmp_path / "host" / "run").exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
