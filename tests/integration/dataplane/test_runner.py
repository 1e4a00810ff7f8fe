"""The pod runner on its own: real processes, namespaces and files; no API server."""
from __future__ import annotations

import asyncio
import base64
import os

from fixtures.dataplane import make_pod, pids_of_pod

PY = "python3"


def terminated(status: dict, index: int = 0) -> dict:
    return status["containerStatuses"][index]["state"].get("terminated") or {}


async def test_env_field_refs_and_var_expansion(runner_harness):
    pod = make_pod("js-w-0-1-abcde", [{
        "name": "w",
        "command": ["echo", "$(R)", "$(N)", "$(UNDEFINED)", "$$(R)", "$(POD)", "$(IP)"],
        "env": [
            {"name": "R", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ]}], annotations={"batch.kubernetes.io/job-completion-index": "1"},
        labels={"jobset.sigs.k8s.io/jobset-name": "js"}, hostname="js-w-0-1", subdomain="js")
    runner = runner_harness.start(pod)
    status = await runner_harness.finished(runner)
    assert status["phase"] == "Succeeded"
    assert terminated(status) ["reason"] == "Completed"
    pod_ip = status["podIP"]
    assert runner_harness.log(pod, "w") == f"1 js $(UNDEFINED) $(R) js-w-0-1-abcde {pod_ip}\n"


async def test_hostname_python_and_gpu_free_env(runner_harness):
    pod = make_pod("p1", [{"name": "c", "command": ["sh", "-c", "hostname; echo $HOSTNAME; python -c 'import sys; print(sys.prefix)'"]}],
                   hostname="js-w-0-0", subdomain="js")
    runner = runner_harness.start(pod)
    await runner_harness.finished(runner)
    lines = runner_harness.log(pod, "c").splitlines()
    expected_host = "js-w-0-0" if runner_harness.network.isolated else lines[0]
    assert lines[0] == expected_host
    assert lines[1] == "js-w-0-0"
    assert lines[2] == os.path.dirname(os.path.dirname(runner_harness.config.bin_dir)) or lines[2].endswith(".venv")


async def test_two_pods_share_port_29500_and_resolve_by_dns_name(runner_harness):
    if not runner_harness.network.isolated:
        return  # shared-network fallback: ports are shared by design
    server = make_pod("js-w-0-0-aaaaa", [{"name": "w", "command": [PY, "-c",
        "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 29500)); s.listen()\nc,_=s.accept(); print('got', c.recv(5).decode())"]}],
        hostname="js-w-0-0", subdomain="js")
    other = make_pod("other-0-aaaaa", [{"name": "w", "command": [PY, "-c",
        "import socket,time\ns=socket.socket(); s.bind(('0.0.0.0', 29500)); s.listen(); print('bound'); time.sleep(0.5)"]}],
        hostname="other-0", subdomain="other")
    first = runner_harness.start(server)
    second = runner_harness.start(other)
    await runner_harness.wait_status(first, lambda s: s["phase"] == "Running")
    client = make_pod("js-w-0-1-bbbbb", [{"name": "w", "command": ["sh", "-c",
        "getent hosts js-w-0-0.js.ns1.svc.cluster.local && "
        "python3 -c \"import socket,time\nfor _ in range(50):\n  try:\n    s=socket.create_connection(('js-w-0-0.js', 29500)); break\n  except OSError: time.sleep(0.1)\ns.send(b'hello')\""]}],
        hostname="js-w-0-1", subdomain="js")
    third = runner_harness.start(client)
    for runner in (first, second, third):
        status = await runner_harness.finished(runner)
        assert status["phase"] == "Succeeded", status
    assert runner_harness.log(server, "w") == "got hello\n"
    assert runner_harness.log(other, "w") == "bound\n"
    resolved = runner_harness.log(client, "w").split()
    assert resolved[0] == first.status()["podIP"]
    assert "js-w-0-0.js.ns1.svc.cluster.local" in resolved


async def test_volumes_env_from_and_init_containers(runner_harness):
    runner_harness.configmaps["cfg"] = {"data": {"train.py": "print('from configmap')", "MODE": "fast"}}
    runner_harness.secrets["sec"] = {"data": {"token": base64.b64encode(b"s3cret").decode()}}
    pod = make_pod("vols", [{
        "name": "main", "workingDir": "/workspace",
        "command": ["sh", "-c", "python3 /opt/ty-test-cfg/train.py; cat /workspace/ready; echo $MODE $TOKEN; cat /opt/ty-test-sec/token; echo; pwd"],
        "envFrom": [{"configMapRef": {"name": "cfg"}}],
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}}],
        "volumeMounts": [{"name": "cfg", "mountPath": "/opt/ty-test-cfg"},
                         {"name": "sec", "mountPath": "/opt/ty-test-sec", "readOnly": True},
                         {"name": "scratch", "mountPath": "/workspace"}]}],
        initContainers=[{"name": "init", "image": "local", "command": ["sh", "-c", "echo init-done > /workspace/ready"],
                         "volumeMounts": [{"name": "scratch", "mountPath": "/workspace"}]}],
        volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "sec", "secret": {"secretName": "sec"}},
                 {"name": "scratch", "emptyDir": {}}])
    runner = runner_harness.start(pod)
    status = await runner_harness.finished(runner)
    assert status["phase"] == "Succeeded", status
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert runner_harness.log(pod, "main").splitlines() == [
        "from configmap", "init-done", "fast s3cret", "s3cret", "/workspace"]
    # Mount targets created on the host for the pod are gone with it.
    assert not os.path.exists("/opt/ty-test-cfg") and not os.path.exists("/workspace")


async def test_missing_configmap_waits_then_starts(runner_harness):
    pod = make_pod("cfgwait", [{"name": "c", "command": ["sh", "-c", "echo $V"],
                                "env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "v"}}}]}])
    runner = runner_harness.start(pod)
    status = await runner_harness.wait_status(
        runner, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError")
    assert status["phase"] == "Pending"
    assert status["containerStatuses"][0]["state"]["waiting"]["message"] == 'configmap "late" not found'
    runner_harness.configmaps["late"] = {"data": {"v": "now"}}
    status = await runner_harness.finished(runner)
    assert status["phase"] == "Succeeded"
    assert runner_harness.log(pod, "c") == "now\n"


async def test_exit_code_and_missing_command_and_unknown_program(runner_harness):
    failing = runner_harness.start(make_pod("fail", [{"name": "c", "command": ["sh", "-c", "exit 3"]}]))
    status = await runner_harness.finished(failing)
    assert status["phase"] == "Failed"
    assert terminated(status) == {**terminated(status), "exitCode": 3, "reason": "Error"}
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["reason"] == "PodFailed" and ready["Ready"]["status"] == "False"
    assert [c["type"] for c in status["conditions"]] == [
        "PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]

    no_command = runner_harness.start(make_pod("nocmd", [{"name": "c"}]))
    status = await runner_harness.finished(no_command)
    assert status["phase"] == "Failed"
    assert terminated(status)["reason"] == "StartError" and terminated(status)["exitCode"] == 128
    assert "no command" in terminated(status)["message"]

    unknown = runner_harness.start(make_pod("unknown", [{"name": "c", "command": ["no-such-program-xyz"]}]))
    status = await runner_harness.finished(unknown)
    assert terminated(status)["message"] == 'exec: "no-such-program-xyz": executable file not found in $PATH'


async def test_on_failure_restarts_in_place_with_previous_log(runner_harness):
    pod = make_pod("flaky", [{"name": "c", "command": ["sh", "-c",
        "if [ -f /state/ran ]; then echo second; exit 0; fi; touch /state/ran; echo first; exit 1"],
        "volumeMounts": [{"name": "state", "mountPath": "/state"}]}],
        restart_policy="OnFailure", volumes=[{"name": "state", "emptyDir": {}}])
    runner = runner_harness.start(pod)
    status = await runner_harness.finished(runner)
    container = status["containerStatuses"][0]
    assert status["phase"] == "Succeeded"
    assert container["restartCount"] == 1
    assert container["lastState"]["terminated"]["exitCode"] == 1
    assert runner_harness.log(pod, "c") == "second\n"
    assert runner_harness.log(pod, "c", previous=True) == "first\n"


async def test_every_earlier_run_of_a_restarted_container_keeps_its_log(runner_harness):
    """--previous is the run just before (as on a kubelet); the first run, which set off the
    restarts, is still on disk after several more (its log was overwritten before)."""
    pod = make_pod("flaky3", [{"name": "c", "command": ["sh", "-c",
        "n=$(cat /state/n 2>/dev/null || echo 0); echo $((n+1)) > /state/n; echo run $n; [ $n -ge 3 ]"],
        "volumeMounts": [{"name": "state", "mountPath": "/state"}]}],
        restart_policy="OnFailure", volumes=[{"name": "state", "emptyDir": {}}])
    runner = runner_harness.start(pod)  # back-offs of 0, 0.2 and 0.4 s at the harness's time scale
    status = await runner_harness.finished(runner)
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["restartCount"] == 3
    assert runner_harness.log(pod, "c") == "run 3\n"
    assert runner_harness.log(pod, "c", previous=True) == "run 2\n"
    directory = runner_harness.data_dir / "pods" / pod["metadata"]["namespace"] / pod["metadata"]["name"]
    assert [(directory / f"c.{attempt}.log").read_text() for attempt in range(3)] == ["run 0\n", "run 1\n", "run 2\n"]
    assert not (directory / "c.3.log").exists()  # the current run is c.log


async def test_termination_signals_process_group_and_leaves_no_orphan(runner_harness):
    graceful = runner_harness.start(make_pod("graceful", [{"name": "c", "command": [
        "sh", "-c", "setsid sleep 300 & trap 'exit 143' TERM; echo started; while true; do sleep 0.1; done"]}]))
    stubborn = runner_harness.start(make_pod("stubborn", [{"name": "c", "command": [
        PY, "-c", "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(300)"]}]))
    for runner in (graceful, stubborn):
        await runner_harness.wait_status(runner, lambda s: s["phase"] == "Running")
    # Running means started, not that the trap and SIG_IGN are in place yet (a loaded machine
    # takes a while to start Python): wait until both programs say so.
    while "started" not in runner_harness.log(graceful.pod, "c") or "up" not in runner_harness.log(stubborn.pod, "c"):
        await asyncio.sleep(0.05)
    escaped = [pid for pid in pids_of_pod(graceful.uid)]
    assert len(escaped) >= 2  # the shell and the setsid'd sleep
    await asyncio.gather(graceful.terminate(5), stubborn.terminate(0.5))
    assert terminated(graceful.status())["exitCode"] == 143
    assert terminated(stubborn.status())["exitCode"] == 137
    assert graceful.status()["phase"] == "Failed"
    assert pids_of_pod(graceful.uid) == [] and pids_of_pod(stubborn.uid) == []


async def test_a_pod_deleted_while_its_container_starts_stops_at_once(runner_harness, monkeypatch):
    """A deletion that comes while a container's process is being spawned stops that process
    too: the soak of `make test` saw a pod deleted within half a second of its start keep
    running (its `sleep 600` counted on the worker) until the data plane restarted. And a
    process that ignores SIGTERM is killed once the grace period is over."""
    from trainyard_services.devcluster.dataplane import containers

    spawn = asyncio.create_subprocess_exec
    stops: list[asyncio.Task] = []

    async def deleted_while_spawning(*args, **kwargs):
        if containers.POD_MARKER_ENV in (kwargs.get("env") or {}):  # a container's process
            # The kubelet's deletion runs while the spawn is in flight (it yields to the loop).
            stops.append(asyncio.ensure_future(runner.terminate(grace)))
            await asyncio.sleep(0.2)
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", deleted_while_spawning)
    for name, program, grace in (("late-sleep", ["sleep", "600"], 30),
                                 ("late-stubborn", [PY, "-c", "import signal,time\n"
                                                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"], 1)):
        runner = runner_harness.start(make_pod(name, [{"name": "c", "command": program}]))
        status = await runner_harness.finished(runner, timeout=15)
        await asyncio.wait_for(stops[-1], 5)
        assert terminated(status)["exitCode"] in (143, 137), status  # SIGTERM, or SIGKILL after the grace
        assert pids_of_pod(runner.uid) == []


async def test_restart_policy_always_restarts_even_after_success(runner_harness):
    runner = runner_harness.start(make_pod("always", [{"name": "c", "command": ["sh", "-c", "echo run"]}],
                                           restart_policy="Always"))
    status = await runner_harness.wait_status(runner, lambda s: s["containerStatuses"][0]["restartCount"] >= 2)
    assert status["phase"] == "Running"
    await runner.terminate(1)
    assert runner.status()["phase"] in ("Succeeded", "Failed")


async def test_sigterm_without_handler_reports_143(runner_harness):
    runner = runner_harness.start(make_pod("plain-sleep", [{"name": "c", "command": ["sleep", "300"]}]))
    await runner_harness.wait_status(runner, lambda s: s["phase"] == "Running")
    await runner.terminate(5)
    state = terminated(runner.status())
    assert (state["exitCode"], state["reason"], state.get("signal")) == (143, "Error", 15)


async def test_failing_liveness_probe_restarts_the_container(runner_harness):
    pod = make_pod("live", [{"name": "c", "command": ["sleep", "300"],
                             "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1,
                                               "failureThreshold": 2}}],
                   restart_policy="OnFailure", terminationGracePeriodSeconds=2)
    runner = runner_harness.start(pod)
    status = await runner_harness.wait_status(runner, lambda s: s["containerStatuses"][0]["restartCount"] >= 1)
    assert status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 143


async def test_pod_active_deadline_fails_the_pod(runner_harness):
    pod = make_pod("deadline", [{"name": "c", "command": ["sleep", "300"]}], activeDeadlineSeconds=1,
                   terminationGracePeriodSeconds=1)
    runner = runner_harness.start(pod)
    status = await runner_harness.finished(runner)
    assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded")
    assert status["message"] == "Pod was active on the node longer than the specified deadline"
    assert terminated(status)["exitCode"] == 143
