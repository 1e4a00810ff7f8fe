"""The Kubeflow SDK's main flow (train, wait, logs, delete) against `trainyard up --api-workers 4`:
the devcluster as 4 API worker processes over one store process, so the SDK's requests, the
services' watches and writes and the data plane's pod updates are spread over the workers.

test_sdk.py runs the whole SDK module against one process; only the main flow runs again here
(each stack start and torch run costs seconds of the suite's budget)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from e2e._sdk_flow import train_wait_logs_delete
from fixtures.stack import RunningStack, skip_unless_stack_available, start_stack

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]
WORKERS = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    skip_unless_stack_available()
    stack = start_stack(tmp_path_factory.mktemp("stack") / "data", "--api-workers", str(WORKERS))
    try:
        yield stack
    finally:
        stack.stop()
        stack.kill()


def test_function_based_training_through_4_api_workers(stack: RunningStack) -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    workers = (Path(stack.data_dir) / "devcluster" / "api-workers").read_text().split()
    assert len(workers) == WORKERS
    client: Any = TrainerClient(KubernetesBackendConfig(config_file=str(stack.kubeconfig)))
    train_wait_logs_delete(client, stack)
