"""The status endpoint's address on a resumed data dir: the devcluster's stored Node still names
the last run's pod-bridge address, which is on no interface of the host any more. `trainyard up`
must hand the status service the address this start's data plane made (and only once it exists),
not the stored one: the status service of a --workers stack failed to bind 10.244.x.1 with
"Cannot assign requested address"."""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.devcluster import start_devcluster as start_api_only
from trainyard.supervisor import kubeapi
from trainyard.supervisor.ports import free_port
from trainyard.supervisor.proctable import ProcessId
from trainyard.supervisor.stack import SINGLE_CLUSTER, ClusterPlan, Stack, StackConfig
from trainyard.supervisor.state import StackState
from trainyard_services.devcluster.dataplane import network

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="pod bridges need root")]

# 10.244.0.0/24 is never a bridge's subnet (choose_subnet picks 10.244.1-254.0/24): the address
# of a run long gone, as certainly absent from the host as a stopped run's.
GONE = "10.244.0.1"
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "devcluster"}}


def bind_error(address: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError as err:
            return f"{address}: {err}"
    return None


def hold_host_network_lock() -> int:
    """What every data plane on this host takes to make its bridge: holding it keeps the
    devcluster's data plane from registering its Node while its API server already serves."""
    network.STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(network.STATE_DIR / network.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_the_status_endpoint_gets_this_starts_node_address_not_the_stored_one(tmp_path: Path, monkeypatch):
    devcluster_dir = tmp_path / "stack" / "devcluster"
    earlier = start_api_only(devcluster_dir)
    try:
        earlier.kubectl("create", "-f", "-", input=json.dumps(NODE))
        earlier.kubectl("patch", "node", "devcluster", "--subresource=status", "--type=merge", "-p",
                        json.dumps({"status": {"addresses": [{"type": "InternalIP", "address": GONE}]}}))
    finally:
        earlier.stop()
    assert bind_error(GONE) is not None

    stack = Stack(StackConfig(data_dir=tmp_path / "stack", nats_port=0, api_port=0, services_port=0,
                              webhook_port=0, startup_timeout_s=90), say=print)
    stack.state = StackState(supervisor=ProcessId.of(os.getpid()))
    cluster = ClusterPlan(name=SINGLE_CLUSTER, prefix="", devcluster_dir=devcluster_dir,
                          kubeconfig=tmp_path / "stack" / "kubeconfig", api_port=free_port(),
                          webhook_port=free_port(), service_ports={})
    stack.clusters = [cluster]

    # The data plane is held at the host lock until the supervisor has had the API server
    # answering and looked again (it waits for the data plane), or has gone on without it.
    answered = 0
    looked_again = asyncio.Event()
    real_answers = kubeapi.server_answers

    async def server_answers(kubeconfig):
        nonlocal answered
        result = await real_answers(kubeconfig)
        answered += bool(result)
        if answered >= 2:
            looked_again.set()
        return result

    monkeypatch.setattr(kubeapi, "server_answers", server_answers)
    lock = await asyncio.to_thread(hold_host_network_lock)
    try:
        started = asyncio.create_task(stack.start_devcluster(cluster))
        started.add_done_callback(lambda _: looked_again.set())
        try:
            await looked_again.wait()
        finally:
            os.close(lock)  # the data plane goes on
        await started
        await stack.prepare_trainjob_status(cluster)
        address = stack.trainjob_status[SINGLE_CLUSTER][0]
        assert address != GONE
        assert bind_error(address) is None, "the status service binds this address"
        # Trainer pods reach the status endpoint at the address of its EndpointSlice.
        slices = await asyncio.to_thread(subprocess.run, [
            str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
            "get", "endpointslices", "-n", "kubeflow-system", "-o", "json"], capture_output=True, text=True, check=True)
        assert [endpoint["addresses"] for item in json.loads(slices.stdout)["items"]
                if "status" in item["metadata"]["name"] for endpoint in item["endpoints"]] == [[address]]
    finally:
        await asyncio.gather(*(child.stop() for child in stack.children.values()))
    assert not (devcluster_dir / "dataplane-ready").exists()
