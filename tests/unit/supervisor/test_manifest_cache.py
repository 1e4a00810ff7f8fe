"""A large manifest (the CRDs: about 1 MB of YAML each, 0.7 s of CPU to parse at every
`trainyard up`) is read from the user's cache as JSON the second time, and the cache never
answers for a file whose bytes changed."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainyard.supervisor import manifests
from trainyard.supervisor.manifests import ManifestError, load_yaml_file

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "trainyard" / "yaml-as-json"


def big_configmap(path: Path, value: str, extra: str = "") -> Path:
    path.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\n{extra}data:\n"
                    f"  blob: {value * (manifests.CACHED_FROM_BYTES // len(value) + 1)}\n")
    return path


def test_the_second_read_comes_from_the_cache_and_an_edit_is_read_anew(tmp_path: Path, cache: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = big_configmap(tmp_path / "big.yaml", "a")
    first = load_yaml_file(path)
    assert len(list(cache.glob("*.json"))) == 1

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed the YAML again")

    monkeypatch.setattr(yaml, "load_all", no_parsing)
    assert load_yaml_file(path) == first
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent.parent))

    big_configmap(path, "b")  # edited: other bytes, another key
    assert load_yaml_file(path)[0]["data"]["blob"].startswith("b")
    assert len(list(cache.glob("*.json"))) == 2


def test_the_crds_read_from_the_cache_equal_the_parsed_yaml(cache: Path) -> None:
    path = REPO / "deploy" / "crds" / "trainer.kubeflow.org_trainjobs.yaml"
    parsed = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert load_yaml_file(path) == parsed
    assert load_yaml_file(path) == parsed  # from the cache


def test_yaml_only_values_are_not_cached_and_bad_yaml_is_still_an_error(tmp_path: Path, cache: Path) -> None:
    dated = big_configmap(tmp_path / "dated.yaml", "a", extra="  annotations:\n    since: 2026-01-01\n")
    assert str(load_yaml_file(dated)[0]["metadata"]["annotations"]["since"]) == "2026-01-01"
    assert not cache.exists() or not list(cache.glob("*.json"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [" + "x" * manifests.CACHED_FROM_BYTES)
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_yaml_file(broken)


def test_an_unwritable_cache_only_costs_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    path = big_configmap(tmp_path / "big.yaml", "a")
    assert load_yaml_file(path)[0]["kind"] == "ConfigMap"
