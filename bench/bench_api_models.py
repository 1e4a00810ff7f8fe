"""Throughput of the API models on the planner's hot path: parse, dump, default.

Run: .venv/bin/python bench/bench_api_models.py   (prints figures; asserts nothing)
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import yaml

from trainyard.api.defaults import apply_defaults
from trainyard.api.objects import dump_object, parse_object

ROOT = Path(__file__).resolve().parents[1]
TRAINJOB = yaml.safe_load((ROOT / "tests/unit/api/examples/trainjob-trainer.yaml").read_text())
RUNTIME = yaml.safe_load((ROOT / "deploy/runtimes/torchtune-llama3.2-1b.yaml").read_text())


def rate(label: str, action: Callable[[], object], seconds: float = 1.0) -> None:
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(100):
            action()
        count += 100
    elapsed = time.perf_counter() - started
    print(f"{label:<40} {count / elapsed:>10,.0f} /s  ({1e6 * elapsed / count:.1f} µs each)")


def main() -> None:
    job, runtime = parse_object(TRAINJOB), parse_object(RUNTIME)
    rate("parse TrainJob", lambda: parse_object(TRAINJOB))
    rate("parse TrainJob (strict)", lambda: parse_object(TRAINJOB, strict=True))
    rate("dump TrainJob", lambda: dump_object(job))
    rate("apply_defaults TrainJob", lambda: apply_defaults(job))
    rate("parse ClusterTrainingRuntime (torchtune)", lambda: parse_object(RUNTIME))
    rate("apply_defaults ClusterTrainingRuntime", lambda: apply_defaults(runtime))


if __name__ == "__main__":
    main()
