"""docs/tenancy.md is true: every ``$ kubectl ...`` / ``$ trainyard ...`` line of its console
blocks runs, in order, from the repository root against a devcluster with the trainer CRDs
(as the page says), and prints exactly the lines the page shows after it."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "tenancy.md"

pytestmark = pytest.mark.slow


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of every ``$ `` line in the ```console blocks."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
    return steps


def run_step(command: str, env: dict[str, str]) -> list[str]:
    """The command's output (stderr and stdout as they come), as the page shows it."""
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120)
    return result.stdout.rstrip("\n").splitlines()


def environment(cluster) -> dict[str, str]:
    return dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), KUBECACHEDIR=str(cluster.cache_dir),
                PATH=f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")


def test_every_command_of_the_page_prints_what_the_page_shows(devcluster_module):
    cluster = devcluster_module
    cluster.kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / "crds"), timeout=120)
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    env = environment(cluster)
    steps = console_steps(DOC.read_text())
    assert len(steps) >= 18
    for command, expected in steps:
        assert run_step(command, env) == expected, command
