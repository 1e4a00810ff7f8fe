"""Which kubeconfig the services and CLI use: the kubectl order, as one table."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from trainyard.kube import kubeconfig as kc


def write(path: Path, *, contexts: dict[str, str], current: str | None = None,
          clusters: dict[str, str] | None = None, users: tuple[str, ...] = ()) -> Path:
    """A kubeconfig with contexts name -> cluster (user = context name)."""
    clusters = clusters or {cluster: f"https://{cluster}.example:6443" for cluster in contexts.values()}
    document = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": s, "certificate-authority": "ca.crt"}} for n, s in clusters.items()],
        "users": [{"name": u, "user": {"token": f"token-{u}", "client-key": "keys/u.key"}} for u in users],
        "contexts": [{"name": n, "context": {"cluster": c, "user": n}} for n, c in contexts.items()],
    }
    if current:
        document["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    return {
        "home": home,
        "home_config": write(home / ".kube" / "config", contexts={"home": "home-cluster"}, current="home"),
        "flag": write(tmp_path / "flag.yaml", contexts={"flag": "flag-cluster"}, current="flag"),
        "ty": write(tmp_path / "ty.yaml", contexts={"ty": "ty-cluster"}, current="ty"),
        "a": write(tmp_path / "a" / "config", contexts={"a": "shared", "both": "a-only"}, current="a",
                   clusters={"shared": "https://from-a:6443", "a-only": "https://a-only:6443"}, users=("a",)),
        "b": write(tmp_path / "b" / "config", contexts={"b": "shared", "both": "b-only"}, current="b",
                   clusters={"shared": "https://from-b:6443", "b-only": "https://b-only:6443"}, users=("b", "both")),
        "no_current": write(tmp_path / "c" / "config", contexts={"c": "c-cluster"}),
    }


def env_for(files: dict[str, Path], spec: dict[str, str]) -> dict[str, str]:
    env = {"HOME": str(files["home"])}
    for name, value in spec.items():
        env[name] = value.format(**{k: str(v) for k, v in files.items()}, sep=os.pathsep)
    return env


# flag, context, env, home config present -> (source kind, context used, server)
TABLE = [
    ("flag beats everything", "{flag}", None, {"TRAINYARD_KUBECONFIG": "{ty}", "KUBECONFIG": "{a}"}, True,
     ("flag", "flag", "https://flag-cluster.example:6443")),
    ("TRAINYARD_KUBECONFIG beats KUBECONFIG", None, None, {"TRAINYARD_KUBECONFIG": "{ty}", "KUBECONFIG": "{a}"}, True,
     ("env", "ty", "https://ty-cluster.example:6443")),
    ("KUBECONFIG beats ~/.kube/config", None, None, {"KUBECONFIG": "{a}"}, True,
     ("KUBECONFIG", "a", "https://from-a:6443")),
    ("KUBECONFIG a:b: first current-context, first cluster of a name", None, None, {"KUBECONFIG": "{a}{sep}{b}"}, True,
     ("KUBECONFIG", "a", "https://from-a:6443")),
    ("KUBECONFIG b:a: order decides", None, None, {"KUBECONFIG": "{b}{sep}{a}"}, True,
     ("KUBECONFIG", "b", "https://from-b:6443")),
    ("KUBECONFIG with missing and empty entries", None, None, {"KUBECONFIG": "/nope{sep}{sep}{b}"}, True,
     ("KUBECONFIG", "b", "https://from-b:6443")),
    ("--context picks from the merged set", None, "b", {"KUBECONFIG": "{a}{sep}{b}"}, True,
     ("KUBECONFIG", "b", "https://from-a:6443")),
    ("--context: a context defined twice is the first file's", None, "both", {"KUBECONFIG": "{a}{sep}{b}"}, True,
     ("KUBECONFIG", "both", "https://a-only:6443")),
    ("current-context from a later file when the first sets none", None, None,
     {"KUBECONFIG": "{no_current}{sep}{b}"}, True, ("KUBECONFIG", "b", "https://from-b:6443")),
    ("~/.kube/config when nothing else", None, None, {}, True, ("home", "home", "https://home-cluster.example:6443")),
    ("--context with --kubeconfig", "{a}", "both", {}, True, ("flag", "both", "https://a-only:6443")),
]


@pytest.mark.parametrize("case", TABLE, ids=[row[0] for row in TABLE])
def test_resolution_table(files, case) -> None:
    _, flag, context, env_spec, home_present, (kind, used, server) = case
    if not home_present:
        files["home_config"].unlink()
    env = env_for(files, env_spec)
    resolved = kc.resolve(flag.format(**{k: str(v) for k, v in files.items()}) if flag else None, context, env=env)
    assert (resolved.source.kind, resolved.context_name, resolved.server()) == (kind, used, server)


def test_merge_keeps_users_of_every_file_and_absolutises_relative_paths(files) -> None:
    resolved = kc.resolve(None, None, env=env_for(files, {"KUBECONFIG": "{a}{sep}{b}"}))
    assert [u["name"] for u in resolved.config["users"]] == ["a", "b", "both"]
    clusters = {c["name"]: c["cluster"] for c in resolved.config["clusters"]}
    assert clusters["shared"]["certificate-authority"] == str(files["a"].parent.resolve() / "ca.crt")
    assert clusters["b-only"]["certificate-authority"] == str(files["b"].parent.resolve() / "ca.crt")
    users = {u["name"]: u["user"] for u in resolved.config["users"]}
    assert users["b"]["client-key"] == str(files["b"].parent.resolve() / "keys" / "u.key")


def test_in_cluster_when_no_kubeconfig_anywhere(files, tmp_path, monkeypatch) -> None:
    files["home_config"].unlink()
    token = tmp_path / "sa" / "token"
    token.parent.mkdir()
    token.write_text("t")
    monkeypatch.setattr(kc, "SERVICE_ACCOUNT_TOKEN", token)
    resolved = kc.resolve(None, None, env={"HOME": str(files["home"]), "KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                           "KUBERNETES_SERVICE_PORT": "443"})
    assert resolved.in_cluster and resolved.source.kind == "in-cluster"
    with pytest.raises(kc.KubeconfigError, match="--context x: no kubeconfig found"):
        kc.resolve(None, "x", env={"HOME": str(files["home"]), "KUBERNETES_SERVICE_HOST": "10.0.0.1"})


@pytest.mark.parametrize("flag,context,env_spec,message", [
    ("/nope/config", None, {}, "--kubeconfig: file not found: /nope/config"),
    (None, None, {"TRAINYARD_KUBECONFIG": "/nope/ty"}, "$TRAINYARD_KUBECONFIG: file not found: /nope/ty"),
    (None, None, {"KUBECONFIG": "/nope/a{sep}/nope/b"}, "$KUBECONFIG: none of its files exists"),
    (None, "missing", {"KUBECONFIG": "{a}{sep}{b}"}, "--context missing: no such context in"),
    (None, None, {"KUBECONFIG": "{no_current}"}, "no current-context; pick one with --context"),
])
def test_errors_say_what_was_looked_at(files, flag, context, env_spec, message) -> None:
    with pytest.raises(kc.KubeconfigError) as err:
        kc.resolve(flag, context, env=env_for(files, env_spec))
    assert message in str(err.value)
    if "no such context" in message:
        assert "contexts: a, b, both" in str(err.value)


def test_nothing_at_all_is_a_clear_error(files) -> None:
    files["home_config"].unlink()
    with pytest.raises(kc.KubeconfigError, match="no cluster configuration: give --kubeconfig, set KUBECONFIG"):
        kc.resolve(None, None, env={"HOME": str(files["home"])})
