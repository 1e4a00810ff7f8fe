"""Golden plans: one representative TrainJob per shipped upstream runtime, full expected output.

Each ``golden/<runtime file stem>.trainjob.yaml`` is planned against the runtime of the same
name in ``shared/reference/trainer-v2.1.0/runtimes/`` and compared with
``golden/<stem>.plan.yaml`` (reviewed by hand against the spec). Set
``TRAINYARD_UPDATE_GOLDEN=1`` to rewrite the expected files after a deliberate change.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fixtures.pipeline_builders import fixed_ssh_key
from trainyard.pipeline import plan, render_yaml

GOLDEN = Path(__file__).parent / "golden"
RUNTIMES = Path(__file__).resolve().parents[4] / "shared" / "reference" / "trainer-v2.1.0" / "runtimes"
CASES = sorted(p.name.removesuffix(".trainjob.yaml") for p in GOLDEN.glob("*.trainjob.yaml"))


def test_every_reference_runtime_has_a_golden_case() -> None:
    assert sorted(p.stem for p in RUNTIMES.glob("*.yaml")) == CASES


@pytest.mark.parametrize("stem", CASES)
def test_golden_plan(stem: str) -> None:
    runtime = yaml.safe_load((RUNTIMES / f"{stem}.yaml").read_text())
    trainjob = yaml.safe_load((GOLDEN / f"{stem}.trainjob.yaml").read_text())
    planned = plan(trainjob, runtime, new_ssh_key=fixed_ssh_key)
    rendered = render_yaml(planned.objects)
    expected_file = GOLDEN / f"{stem}.plan.yaml"
    if os.environ.get("TRAINYARD_UPDATE_GOLDEN") == "1":
        expected_file.write_text(rendered)
    assert list(yaml.safe_load_all(rendered)) == list(yaml.safe_load_all(expected_file.read_text()))
    assert rendered == expected_file.read_text()


def test_spec_worked_example_transcribed_by_hand() -> None:
    case = yaml.safe_load((GOLDEN / "worked_example_9_2.yaml").read_text())
    planned = plan(case["trainjob"], case["runtime"])
    assert list(planned.objects) == case["expected"]  # dict equality: key order does not matter
