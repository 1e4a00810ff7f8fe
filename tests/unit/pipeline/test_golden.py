"""Golden plans: one representative TrainJob per shipped upstream runtime, full expected output.

Each ``golden/<runtime file stem>.trainjob.yaml`` is planned against the runtime of the same
name in ``shared/reference/trainer-v2.1.0/runtimes/`` and compared with
``golden/<stem>.plan.yaml`` (reviewed by hand against the spec) under ``--trainer-compat v2.1``,
the level those plans describe. Set
``TRAINYARD_UPDATE_GOLDEN=1`` to rewrite the expected files after a deliberate change.
``golden/v2.3.0/`` does the same for ``trainer-v2.3.0/runtimes/`` (JAX, XGBoost, and the torch
case with runtimePatches after podTemplateOverrides) at the default level (v2.3). ``golden/flux/`` plans against the runtime
beside each case (``<stem>.runtime.yaml``): v2.3.0 ships no Flux default runtime.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fixtures.pipeline_builders import fixed_ssh_key
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.pipeline import plan, render_yaml

GOLDEN = Path(__file__).parent / "golden"
RUNTIMES = Path(__file__).resolve().parents[4] / "shared" / "reference" / "trainer-v2.1.0" / "runtimes"
CASES = sorted(p.name.removesuffix(".trainjob.yaml") for p in GOLDEN.glob("*.trainjob.yaml"))
GOLDEN_V23 = GOLDEN / "v2.3.0"
RUNTIMES_V23 = RUNTIMES.parents[1] / "trainer-v2.3.0" / "runtimes"
CASES_V23 = sorted(p.name.removesuffix(".trainjob.yaml") for p in GOLDEN_V23.glob("*.trainjob.yaml"))
GOLDEN_FLUX = GOLDEN / "flux"
CASES_FLUX = sorted(p.name.removesuffix(".trainjob.yaml") for p in GOLDEN_FLUX.glob("*.trainjob.yaml"))


def fixed_curve_key() -> tuple[bytes, bytes]:
    return bytes(range(32)), bytes(range(32, 64))


def test_every_reference_runtime_has_a_golden_case() -> None:
    assert sorted(p.stem for p in RUNTIMES.glob("*.yaml")) == CASES


def test_every_v2_3_0_reference_runtime_has_a_golden_case() -> None:
    if not RUNTIMES_V23.is_dir():
        pytest.skip(f"{RUNTIMES_V23} is not present")
    assert sorted(p.stem for p in RUNTIMES_V23.glob("*.yaml")) == CASES_V23


@pytest.mark.parametrize(("release", "stem"), [("v2.1.0", s) for s in CASES] + [("v2.3.0", s) for s in CASES_V23]
                         + [("flux", s) for s in CASES_FLUX])
def test_golden_plan(release: str, stem: str) -> None:
    if release == "flux":
        golden = GOLDEN_FLUX
        runtime = yaml.safe_load((golden / f"{stem}.runtime.yaml").read_text())
    else:
        runtimes, golden = (RUNTIMES, GOLDEN) if release == "v2.1.0" else (RUNTIMES_V23, GOLDEN_V23)
        runtime = yaml.safe_load((runtimes / f"{stem}.yaml").read_text())
    trainjob = yaml.safe_load((golden / f"{stem}.trainjob.yaml").read_text())
    compat = TrainerCompat.V2_1 if release == "v2.1.0" else DEFAULT_COMPAT
    planned = plan(trainjob, runtime, new_ssh_key=fixed_ssh_key, new_curve_key=fixed_curve_key, compat=compat)
    rendered = render_yaml(planned.objects)
    expected_file = golden / f"{stem}.plan.yaml"
    if os.environ.get("TRAINYARD_UPDATE_GOLDEN") == "1":
        expected_file.write_text(rendered)
    assert list(yaml.safe_load_all(rendered)) == list(yaml.safe_load_all(expected_file.read_text()))
    assert rendered == expected_file.read_text()


def test_spec_worked_example_transcribed_by_hand() -> None:
    case = yaml.safe_load((GOLDEN / "worked_example_9_2.yaml").read_text())
    planned = plan(case["trainjob"], case["runtime"], compat=TrainerCompat.V2_1)  # the spec describes v2.1.0
    assert list(planned.objects) == case["expected"]  # dict equality: key order does not matter
