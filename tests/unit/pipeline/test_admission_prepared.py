"""The planner prepares admission before its webhook is registered (services/planner/main.py):
the first request must not pay for generating the CRD schemas and compiling their CEL rules
(about 0.7 s of CPU: on a loaded machine, with four test processes and a busy core, a fresh
planner's first ClusterTrainingRuntime admission outlasted the API server's 10 s webhook
timeout, "failed calling webhook ... context deadline exceeded")."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Run in a fresh interpreter: the caches are per process.
SCRIPT = """
import json, sys, yaml
from pathlib import Path
from trainyard.apimachinery.cel import compile_rule
from trainyard.pipeline.validation import prepare_admission, validate_runtime, validate_trainjob
compiled = prepare_admission()
before = compile_rule.cache_info()
runtime = yaml.safe_load(Path(sys.argv[1]).read_text())
trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"runtimeRef": {"name": runtime["metadata"]["name"]}, "trainer": {"numNodes": 2}}}
allowed = [validate_runtime(runtime).allowed, validate_trainjob(trainjob, runtime=runtime).allowed]
after = compile_rule.cache_info()
print(json.dumps({"compiled": compiled, "new_compilations": after.misses - before.misses, "allowed": allowed}))
"""


def test_the_first_admission_after_preparing_compiles_nothing() -> None:
    runtime = REPO / "tests" / "unit" / "pipeline" / "golden" / "flux" / "flux_distributed.runtime.yaml"
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(runtime)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["allowed"] == [True, True]
    assert found["compiled"] > 10  # every rule of the three CRDs
    assert found["new_compilations"] == 0, "the first admission compiled CEL rules itself"

