"""Building the package says nothing about its own configuration, and the wheel carries its data.

setuptools reports a packaging configuration it finds ambiguous (e.g. a data folder such as
services/dashboard/static that Python could import but `packages` does not list) as a warning
in a wall of `!!` lines, in `make demo`'s editable install as in a wheel build. These tests build
from a copy of the checkout (so no build/ or egg-info lands in it) with the environment's own
setuptools (`--no-build-isolation`: offline, seconds), and install nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fixtures.checkout import copy_checkout

REPO = Path(__file__).resolve().parents[3]

# What setuptools prints for a configuration problem: a *Warning category, the `!!` frame
# around its long messages, or the data-folder warning itself.
CONFIG_WARNING = re.compile(r"Warning|!!|absent from the `?packages`? configuration")
# setuptools' notice closing every editable build that uses a meta path finder (this project's
# layout maps libs/trainyard and services/ to other names, so always): informational, in the
# same `!!` frame, followed by the source line the warnings module quotes. pip relabels it
# BuildBackendWarning; no configuration avoids it short of moving the sources.
EDITABLE_NOTICE = re.compile(
    r"^[^\n]*(?:InformationOnly|BuildBackendWarning): Editable installation\.\n[ \t]*!!\n.*?\n[ \t]*!!\n(?:[ \t]+[^\n]*\n)?",
    re.DOTALL | re.MULTILINE,
)


def _config_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if CONFIG_WARNING.search(line)]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files git would commit (tracked and untracked, not ignored)."""
    return copy_checkout(tmp_path_factory.mktemp("packaging") / "source")


def _expected_wheel_files(source: Path) -> set[str]:
    """Where each shipped source file lands in the wheel (setup.py's layout)."""
    expected = set()
    for path in source.rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        name = path.relative_to(source).as_posix()
        if name.startswith("libs/trainyard/") and path.suffix in (".py", ".yaml", ".json"):
            expected.add(name[len("libs/"):])
        elif name.startswith("services/dashboard/static/"):
            expected.add("trainyard_services/" + name[len("services/"):])
        elif name.startswith("services/") and path.suffix == ".py":
            expected.add("trainyard_services/" + name[len("services/"):])
        elif name.startswith(("deploy/", "examples/")):
            expected.add("trainyard/_data/" + name)
    return expected


def test_wheel_builds_without_configuration_warnings(source: Path) -> None:
    out = source.parent / "wheels"
    # -v: everything the backend prints, not only what pip chooses to show.
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                             "-w", str(out), str(source)], cwd=source.parent, capture_output=True, text=True,
                            timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert _config_warnings(output) == [], output

    (wheel,) = out.glob("trainyard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
    # The dashboard's assets, the CRDs and runtimes, and nothing more or less than the sources.
    static = {n for n in names if n.startswith("trainyard_services/dashboard/static/")}
    assert {"trainyard_services/dashboard/static/index.html", "trainyard_services/dashboard/static/app.js",
            "trainyard_services/dashboard/static/charts.js", "trainyard_services/dashboard/static/style.css"} <= static
    assert "trainyard/_data/deploy/crds/trainer.kubeflow.org_trainjobs.yaml" in names
    assert "trainyard/_data/deploy/runtimes/kustomization.yaml" in names
    assert names == _expected_wheel_files(source)


def test_editable_build_without_configuration_warnings(source: Path) -> None:
    """The editable wheel `make demo`'s `pip install -e` builds, through the same backend hook."""
    out = source.parent / "editable"
    out.mkdir()
    result = subprocess.run([sys.executable, "-c",
                             "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))",
                             str(out)], cwd=source, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert (out / result.stdout.strip().splitlines()[-1]).is_file(), output
    assert _config_warnings(EDITABLE_NOTICE.sub("", output)) == [], output
