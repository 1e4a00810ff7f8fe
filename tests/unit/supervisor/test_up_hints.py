"""The two "try this" lines `trainyard up` prints can be pasted as they are, from any directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli.up import _try_this

REPO = Path(__file__).resolve().parents[3]


def test_from_the_repository_root_paths_are_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    get, apply = _try_this(Path("/data/kubeconfig"))
    assert get.endswith("--kubeconfig /data/kubeconfig get clustertrainingruntimes")
    assert apply.endswith("--kubeconfig /data/kubeconfig apply -k examples/torch-ddp-cpu/")


def test_from_elsewhere_paths_are_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    _, apply = _try_this(Path("/data/kubeconfig"))
    assert apply.endswith(f"apply -k {REPO / 'examples' / 'torch-ddp-cpu'}/")
    kubectl = apply.split()[0]
    assert Path(kubectl).is_absolute() and Path(kubectl).name == "kubectl"
