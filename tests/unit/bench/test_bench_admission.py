"""bench/admission.py (issue #33: a create answered within 1 s with the planner at 0.03 CPU):
its summary line says how many creates were answered within 1 s and the planner's CPU each."""
from __future__ import annotations

from fixtures.benchmodules import load_bench

_admission = load_bench("admission", "bench_admission")


def test_the_summary_counts_creates_within_one_second_and_cpu_per_create() -> None:
    line = _admission.summary("TrainJob", [120.0, 480.0, 1200.0, 900.0], cpu_ms=80.0)
    assert "within 1 s: 3/4" in line
    assert "max  1200.0 ms" in line
    assert "planner CPU   20.0 ms per create" in line


def test_runtimes_are_named_apart_from_the_one_the_trainjobs_use() -> None:
    first, second = _admission.runtime("bench-admission-0"), _admission.runtime("bench-admission-1")
    assert first["metadata"] == {"name": "bench-admission-0"}
    assert first["spec"] == second["spec"] == _admission.RUNTIME["spec"]
    assert _admission.RUNTIME["metadata"]["name"] == "bench-torch"
