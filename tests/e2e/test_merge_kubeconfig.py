"""`trainyard up --merge-kubeconfig` adds a uniquely named context to the user's kubeconfig (as
kind does) and `trainyard down` removes it, leaving the user's own entries as they were. HOME is
a temporary directory: the real ~/.kube/config is never touched."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.stack import skip_unless_stack_available, start_stack
from trainyard.supervisor.userkube import (
    context_name,
    merge_into_user_kubeconfig,
    remove_from_user_kubeconfig,
    user_kubeconfig_path,
)

KUBECTL = Path(sys.executable).parent / "kubectl"

USERS_OWN = {
    "apiVersion": "v1", "kind": "Config", "current-context": "work",
    "clusters": [{"name": "work", "cluster": {"server": "https://work.example:6443"}}],
    "users": [{"name": "me", "user": {"token": "secret"}}],
    "contexts": [{"name": "work", "context": {"cluster": "work", "user": "me"}}],
}


def test_up_merges_and_down_removes_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_stack_available()
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    user_config = home / ".kube" / "config"
    user_config.write_text(yaml.safe_dump(USERS_OWN))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("TRAINYARD_KUBECONFIG", raising=False)
    data_dir = tmp_path / "stack"
    stack = start_stack(data_dir, "--merge-kubeconfig")
    try:
        name = context_name(data_dir)
        merged = yaml.safe_load(user_config.read_text())
        assert merged["current-context"] == name
        assert [c["name"] for c in merged["contexts"]] == ["work", name]
        assert merged["users"][0] == USERS_OWN["users"][0]
        assert oct(user_config.stat().st_mode & 0o777) == "0o600"
        # Plain kubectl, no --kubeconfig: the merged current context is the stack.
        env = dict(os.environ, HOME=str(home))
        result = subprocess.run([str(KUBECTL), f"--cache-dir={tmp_path / 'cache'}", "get", "clustertrainingruntimes",
                                 "-o", "name"], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in result.stdout
    finally:
        down = stack.stop()
        stack.kill()
    # The stopping supervisor removes it (`down` would if the supervisor had been killed).
    assert "Context removed from the user's kubeconfig." in stack.output() or \
        f"removed context {name} from {user_config}" in down.stdout, stack.output() + down.stdout
    after = yaml.safe_load(user_config.read_text())
    assert [c["name"] for c in after["contexts"]] == ["work"]
    assert [c["name"] for c in after["clusters"]] == ["work"] and [u["name"] for u in after["users"]] == ["me"]
    assert "current-context" not in after  # it was ours; kind leaves none either


def test_merge_goes_to_the_first_kubeconfig_file_and_keeps_the_users_current_context(tmp_path: Path) -> None:
    stack_config = tmp_path / "stack" / "kubeconfig"
    stack_config.parent.mkdir()
    stack_config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "devcluster",
        "clusters": [{"name": "devcluster", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "admin", "user": {"token": "t"}}],
        "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": "admin"}}],
    }))
    first, second = tmp_path / "first", tmp_path / "second"
    second.write_text(yaml.safe_dump(USERS_OWN))
    env = {"KUBECONFIG": os.pathsep.join(["", str(first), str(second)]), "HOME": str(tmp_path / "home")}
    assert user_kubeconfig_path(env) == first
    merged = merge_into_user_kubeconfig(stack_config, stack_config.parent, env)
    assert merged.path == first and not (tmp_path / "home").exists()
    document = yaml.safe_load(first.read_text())
    assert document["clusters"][0]["cluster"]["certificate-authority"] == str(stack_config.parent.resolve() / "ca.crt")
    again = merge_into_user_kubeconfig(stack_config, stack_config.parent, env)  # a resumed `up`: replaced
    assert again == merged and len(yaml.safe_load(first.read_text())["contexts"]) == 1
    # The user switched context meanwhile: down removes our entries, not their choice.
    document = yaml.safe_load(first.read_text())
    document["current-context"] = "work"
    first.write_text(yaml.safe_dump(document))
    assert remove_from_user_kubeconfig(stack_config.parent) == merged
    assert yaml.safe_load(first.read_text()) == {"apiVersion": "v1", "kind": "Config", "preferences": {},
                                                 "clusters": [], "users": [], "contexts": [], "current-context": "work"}
    assert remove_from_user_kubeconfig(stack_config.parent) is None
    assert yaml.safe_load(second.read_text()) == USERS_OWN


def test_context_names_are_unique_per_data_dir(tmp_path: Path) -> None:
    a, b = tmp_path / "x" / "data", tmp_path / "y" / "data"
    assert context_name(a) != context_name(b)
    assert context_name(a).startswith("trainyard-data-") and context_name(a) == context_name(a)
