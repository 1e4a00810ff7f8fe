"""Property-based fuzzing of the files the CLI reads: `trainyard validate -f`, `trainyard plan -f`
and `trainyard crds --check --out DIR`.

Random YAML and JSON documents, binary junk, wrong kinds, objects with a random value anywhere:
the command either succeeds or exits non-zero with a clear error (one `error:` line naming the
file or document, or kubectl's rejection lines) and never a Python traceback. The fuzzers call
the command's entry in-process for speed; a few of the found inputs also run as the real
`trainyard` process.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.fuzz_strategies import json_values, paths_of, replaced

from trainyard.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("TRAINYARD_FUZZ_EXAMPLES", "0"))


def fuzz_settings(default: int) -> settings:
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed"},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                 "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}}}]}}},
}
TRAINJOB = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2, "image": "busybox", "command": ["true"],
                                 "env": [{"name": "A", "value": "1"}],
                                 "resourcesPerNode": {"limits": {"cpu": "1"}}}}}

@st.composite
def documents(draw) -> bytes:
    seed = draw(st.sampled_from([TRAINJOB, RUNTIME]))
    choice = draw(st.integers(0, 8))
    if choice == 0:
        return draw(st.binary(max_size=300))
    if choice == 1:  # any JSON value as a document (JSON is YAML)
        return json.dumps(draw(json_values)).encode()
    if choice == 2:  # a random value anywhere in a TrainJob or runtime
        path = draw(st.sampled_from(paths_of(seed)[1:]))
        return yaml.safe_dump(replaced(seed, path, draw(json_values))).encode()
    if choice == 3:  # YAML tags and odd scalars where a value goes
        path = draw(st.sampled_from(paths_of(seed)[1:]))
        tag = draw(st.sampled_from(["!!binary aGVsbG8=", "2001-12-14t21:59:43.10-05:00", "!!set {a, b}",
                                    "!!python/object:os.system {}", ".nan", ".inf", "!!timestamp 2002-12-14",
                                    "!custom x", "!!omap [a: 1]", "2020-01-01", "0o17", "~", "&a [*a]"]))
        return yaml.safe_dump(replaced(seed, path, "__TAG__")).replace("__TAG__", tag).encode()
    if choice == 4:  # wrong kinds and versions
        return yaml.safe_dump(dict(seed, kind=draw(st.one_of(st.sampled_from(
            ["TrainJob", "JobSet", "List", "ConfigMap", "TrainingRuntime", "", "trainjob"]), json_values)),
            apiVersion=draw(st.one_of(st.sampled_from(["trainer.kubeflow.org/v1alpha1", "v1",
                                                       "trainer.kubeflow.org/v1"]), json_values)))).encode()
    if choice == 5:  # several documents, some empty or not mappings
        parts = draw(st.lists(st.sampled_from([yaml.safe_dump(TRAINJOB), yaml.safe_dump(RUNTIME), "", "- 1\n",
                                               "x\n", "kind: List\nitems: 5\n", "kind: List\nitems: [1]\n"]),
                              min_size=1, max_size=4))
        return "---\n".join(parts).encode()
    if choice == 6:  # a truncated document
        text = yaml.safe_dump(seed)
        return text[:draw(st.integers(1, len(text) - 1))].encode()
    if choice == 7:  # an alias bomb (bounded)
        levels, width = draw(st.integers(2, 8)), draw(st.integers(2, 9))
        lines = [yaml.safe_dump(TRAINJOB).rstrip("\n"), "x:", "  a0: &a0 [lol]"]
        lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
        lines.append(f"  all: *a{levels - 1}")
        return "\n".join(lines).encode()
    return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def check_cli_answer(code: int, stdout: str, stderr: str, what: str) -> None:
    assert "Traceback" not in stderr, f"{what}:\n{stderr}"
    if code == 0:
        return
    assert code in (1, 2), f"{what}: exit {code}\n{stderr}"
    lines = [line for line in stderr.splitlines() if line and not line.startswith("Warning: ")]
    assert lines, f"{what}: exit {code} with nothing on stderr"
    assert lines[0].startswith(("error: ", "Error from server (")), f"{what}: unclear error line {lines[0]!r}"
    for line in lines[1:]:  # kubectl lists several causes of one rejection as "* <field>: ..." lines
        assert line.startswith(("error: ", "Error from server (", "* ")), f"{what}: unclear error line {line!r}"


@fuzz_settings(120)
@given(command=st.sampled_from(["validate", "plan"]), body=documents(), with_runtime=st.booleans())
def test_validate_and_plan_files(fuzz_count, command, body, with_runtime):
    fuzz_count(f"cli {command} -f files")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.yaml"
        path.write_bytes(body)
        argv = [command, "-f", str(path)]
        if with_runtime:
            (Path(tmp) / "runtimes").mkdir()
            (Path(tmp) / "runtimes" / "torch.yaml").write_text(yaml.safe_dump(RUNTIME))
            argv += ["--runtimes", str(Path(tmp) / "runtimes")]
        code, stdout, stderr = run_cli(argv)
    check_cli_answer(code, stdout, stderr, f"trainyard {command} -f {body[:300]!r}")
    if code != 0 and "error: " in stderr and not stderr.startswith("Error from server"):
        first = [line for line in stderr.splitlines() if line.startswith("error: ")][0]
        assert "input.yaml" in first or "TrainJob" in first or "no TrainJob" in first, \
            f"the error names neither the file nor the document: {first!r}"


@fuzz_settings(4)
@given(files=st.dictionaries(st.sampled_from(["trainer.kubeflow.org_trainjobs.yaml", "jobset.x-k8s.io_jobsets.yaml",
                                              "other.yaml"]), st.binary(max_size=100), max_size=3))
def test_crds_check_against_a_directory_of_junk(fuzz_count, files):
    fuzz_count("cli crds --check --out DIR")
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in files.items():
            (Path(tmp) / name).write_bytes(content)
        code, stdout, stderr = run_cli(["crds", "--check", "--out", tmp])
    what = f"trainyard crds --check with {sorted(files)}"
    assert "Traceback" not in stderr and code in (0, 1), f"{what}: exit {code}\n{stderr}"
    if code == 1:  # one line per file that is not what generation writes, naming it
        lines = stderr.splitlines()
        assert lines and all(line.startswith(tmp) and "differs" in line for line in lines), f"{what}:\n{stderr}"


@pytest.mark.parametrize("body", [
    b"\xff\xfe\x00junk",
    # an alias bomb: validation walked 10**8 values (minutes, gigabytes); refused at once now
    b"apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\nx:\n  a0: &a0 [lol]\n"
    + b"".join(b"  a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]\n" for i in range(1, 9))
    + b"spec: {bomb: *a8}\n",
])
def test_the_real_process_prints_no_traceback(tmp_path, body):
    path = tmp_path / "input.yaml"
    path.write_bytes(body)
    result = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "plan", "-f", str(path)],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert str(path) in result.stderr


def test_an_integer_too_long_for_python_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\n"
                    "spec: {trainer: {numNodes: " + "1" * 5000 + "}}\n")
    code, _, stderr = run_cli(["validate", "-f", str(path)])
    assert code == 2 and stderr.startswith(f"error: {path}: invalid YAML: Exceeds the limit"), stderr


def test_crds_check_names_a_file_that_is_not_text(tmp_path):
    # a CRD file that is not UTF-8 raised UnicodeDecodeError out of `trainyard crds --check`
    (tmp_path / "trainer.kubeflow.org_trainjobs.yaml").write_bytes(b"\x81\x82")
    code, _, stderr = run_cli(["crds", "--check", "--out", str(tmp_path)])
    assert code == 1 and "Traceback" not in stderr
    assert f"{tmp_path}/trainer.kubeflow.org_trainjobs.yaml: differs" in stderr
