"""`trainyard up` / `trainyard down` as a user runs them, with only embedded NATS (the part of the
stack that needs nothing else): readiness, restart after a crash, resume, Ctrl-C, clear errors."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fixtures.stack import RunningStack, start_stack

NATS_ONLY = ("--skip", "devcluster", "--skip", "watcher", "--skip", "planner", "--skip", "applier", "--skip", "status")


def trainyard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainyard.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def nats_answers(stack: RunningStack) -> bool:
    port = int(stack.state["ports"]["nats"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            return conn.recv(5) == b"INFO "
    except OSError:
        return False


def read_state(stack: RunningStack) -> dict:
    return json.loads((stack.data_dir / "stack.json").read_text())


def test_up_reports_ready_and_down_leaves_nothing_behind(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        assert nats_answers(stack)
        assert (stack.data_dir / "trainyard.pid").read_text().strip() == str(stack.pid)
        nats_pid = stack.state["children"]["nats"]["pid"]
        assert nats_pid in stack.seen_processes
        down = stack.stop()
        assert down.returncode == 0, down.stderr
        assert f"stopped the stack in {stack.data_dir}" in down.stdout
        assert stack.process.returncode == 0
        assert stack.survivors() == []
        assert not (stack.data_dir / "trainyard.pid").exists()
        assert "nats        ready" in stack.output()
        assert (stack.data_dir / "logs" / "nats.log").stat().st_size > 0
    finally:
        stack.kill()


def test_a_crashed_child_is_restarted(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        first = stack.state["children"]["nats"]
        os.kill(first["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        state = read_state(stack)
        while time.monotonic() < deadline and state["children"]["nats"]["pid"] == first["pid"]:
            time.sleep(0.1)
            state = read_state(stack)
        assert state["children"]["nats"]["pid"] != first["pid"], stack.output()
        assert state["restarts"]["nats"] == 1
        while time.monotonic() < deadline and not nats_answers(stack):
            time.sleep(0.1)
        assert nats_answers(stack)
        assert "nats exited with code -9; restarting" in stack.output()
        assert stack.stop().returncode == 0
        assert stack.survivors() == []
    finally:
        stack.kill()


def test_children_follow_a_killed_supervisor_and_the_data_dir_is_usable_again(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        stack.process.send_signal(signal.SIGKILL)
        stack.process.wait(timeout=10)
        deadline = time.monotonic() + 15
        while stack.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stack.survivors() == [], "children outlived their SIGKILLed supervisor"
        down = trainyard("down", "--data-dir", str(stack.data_dir))
        assert down.returncode == 0 and "nothing running" in down.stdout
    finally:
        stack.kill()
    again = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        assert nats_answers(again)
    finally:
        again.stop()
        again.kill()


def test_down_kills_what_a_dead_supervisor_left_behind(tmp_path: Path) -> None:
    """A child that ignores SIGTERM outlives its SIGKILLed supervisor; `down` finds it in
    stack.json and kills its whole process group."""
    from trainyard.supervisor.binaries import nats_server_binary

    stubborn = tmp_path / "stubborn-nats-server"
    stubborn.write_text(f"#!/bin/sh\ntrap '' TERM\n{nats_server_binary()} \"$@\" &\nwait\n")
    stubborn.chmod(0o755)
    up = [sys.executable, "-m", "trainyard.cli.main", "up", "--free-ports", "--data-dir", str(tmp_path / "data"), *NATS_ONLY]
    env = {**os.environ, "TRAINYARD_NATS_SERVER": str(stubborn)}
    stack = start_stack_with(up, env, tmp_path / "data")
    try:
        stack.process.send_signal(signal.SIGKILL)
        stack.process.wait(timeout=10)
        time.sleep(1)
        assert stack.survivors(), "the stubborn child should still run"
        down = trainyard("down", "--data-dir", str(stack.data_dir))
        assert down.returncode == 0
        assert "killed leftover processes: nats (pid" in down.stdout
        deadline = time.monotonic() + 10
        while stack.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stack.survivors() == []
    finally:
        stack.kill()


def start_stack_with(argv: list[str], env: dict[str, str], data_dir: Path) -> RunningStack:
    output = data_dir.parent / "up.out"
    data_dir.mkdir(parents=True, exist_ok=True)
    with output.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    stack = RunningStack(data_dir=data_dir, process=process, output_file=output, state={})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, stack.output()
        try:
            state = read_state(stack)
        except (FileNotFoundError, ValueError):
            state = {}
        if state.get("ready"):
            stack.state = state
            stack.remember_processes()
            return stack
        time.sleep(0.2)
    stack.kill()
    raise AssertionError(f"not ready: {stack.output()}")


def test_second_up_on_a_running_data_dir_is_refused(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        second = trainyard("up", "--free-ports", "--data-dir", str(stack.data_dir), *NATS_ONLY)
        assert second.returncode == 1
        assert f"a trainyard stack is already running on {stack.data_dir} (pid {stack.pid})" in second.stderr
        assert "trainyard down --data-dir" in second.stderr
        assert "Traceback" not in second.stderr
        assert stack.process.poll() is None
    finally:
        stack.stop()
        stack.kill()


def test_up_again_resumes_with_jetstream_data_kept(tmp_path: Path) -> None:
    async def put_then_get(stack, value: bytes | None) -> bytes:
        connection = await stack.nats_connect("admin")
        try:
            js = connection.jetstream()
            if value is not None:
                kv = await js.create_key_value(bucket="resume_check")
                await kv.put("k", value)
            kv = await js.key_value("resume_check")
            return (await kv.get("k")).value
        finally:
            await connection.close()

    data_dir = tmp_path / "data"
    first = start_stack(data_dir, *NATS_ONLY)
    try:
        assert asyncio.run(put_then_get(first, b"kept")) == b"kept"
    finally:
        first.stop()
        first.kill()
    second = start_stack(data_dir, *NATS_ONLY)
    try:
        assert asyncio.run(put_then_get(second, None)) == b"kept"
        assert f"trainyard: resuming in {data_dir}" in second.output()
    finally:
        second.stop()
        second.kill()


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        stack.process.send_signal(signal.SIGINT)
        assert stack.process.wait(timeout=30) == 0
        assert stack.survivors() == []
        assert "trainyard: stopped" in stack.output()
    finally:
        stack.kill()


def test_busy_port_is_reported_clearly(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        result = trainyard("up", "--data-dir", str(tmp_path), "--nats-port", str(busy), *NATS_ONLY)
    assert result.returncode == 1
    assert f"error: port {busy} (NATS client port) is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_nats_server_is_reported_clearly(tmp_path: Path) -> None:
    result = trainyard("up", "--free-ports", "--data-dir", str(tmp_path), *NATS_ONLY,
                       env={"TRAINYARD_NATS_SERVER": str(tmp_path / "no-nats-server")})
    assert result.returncode == 1
    assert "TRAINYARD_NATS_SERVER=" in result.stderr and "is not an executable file" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_component_dying_at_startup_is_reported_with_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken-nats-server"
    broken.write_text("#!/bin/sh\necho 'nats: cannot open the store: disk on fire' >&2\nexit 3\n")
    broken.chmod(0o755)
    result = trainyard("up", "--free-ports", "--data-dir", str(tmp_path / "data"), *NATS_ONLY,
                       env={"TRAINYARD_NATS_SERVER": str(broken)})
    assert result.returncode == 1
    assert "error: nats exited with code 3 while starting" in result.stderr
    assert "disk on fire" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "trainyard: stopped" in result.stdout


def test_unknown_component_to_skip_is_a_user_error(tmp_path: Path) -> None:
    result = trainyard("up", "--free-ports", "--data-dir", str(tmp_path), "--skip", "kafka")
    assert result.returncode == 1
    assert "--skip: unknown component(s) kafka" in result.stderr


def test_services_without_devcluster_need_a_kubeconfig(tmp_path: Path) -> None:
    result = trainyard("up", "--free-ports", "--data-dir", str(tmp_path), "--skip", "devcluster")
    assert result.returncode == 1
    assert f"--skip devcluster: the services need the API server's kubeconfig at {tmp_path.resolve()}/kubeconfig" in result.stderr


def test_down_with_nothing_running(tmp_path: Path) -> None:
    result = trainyard("down", "--data-dir", str(tmp_path))
    assert result.returncode == 0
    assert "nothing running" in result.stdout
    missing = trainyard("down", "--data-dir", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert "--data-dir:" in missing.stderr and "does not exist" in missing.stderr
