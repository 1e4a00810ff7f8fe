from __future__ import annotations

import argparse
import json
import logging

import httpx
import pytest

from trainyard.cli.main import main
from trainyard.errors import UserError
from trainyard.host.health import HealthServer
from trainyard.telemetry import metrics  # noqa: F401 - registers the service metrics /metrics must serve
from trainyard.telemetry.logging import JsonFormatter
from trainyard.host.service import add_common_flags, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_flags(parser)
    return parser.parse_args(argv)


def test_flags_and_env(monkeypatch):
    monkeypatch.setenv("TRAINYARD_NATS_URL", "nats://nats:4222")
    monkeypatch.setenv("TRAINYARD_HTTP_PORT", "0")
    config = config_from_args("watcher", parse("--cluster", "east"))
    assert (config.nats_url, config.http_port, config.cluster) == ("nats://nats:4222", 0, "east")


@pytest.mark.parametrize("argv,message", [
    (["--http-port", "70000"], "--http-port: must be between 0 and 65535, got 70000"),
    (["--http-port", "x"], "--http-port: expected a number, got 'x'"),
    (["--nats-url", "localhost:4222"], "--nats-url: expected a nats:// URL, got 'localhost:4222'"),
    (["--kubeconfig", "/nope/config"], "--kubeconfig: file not found: /nope/config"),
    (["--ack-wait", "0"], "--ack-wait: must be greater than 0"),
])
def test_bad_flags_name_the_flag(argv, message):
    with pytest.raises(UserError) as err:
        config_from_args("watcher", parse(*argv))
    assert str(err.value) == message


@pytest.mark.parametrize("argv,message", [
    (["applier", "--claim-lease", "soon"], "--claim-lease: expected seconds, got 'soon'"),
    (["applier", "--claim-lease", "0"], "--claim-lease: must be greater than 0"),
    (["planner", "--webhook-drain", "-1"], "--webhook-drain: must be 0 or more, got '-1'"),
    (["planner", "--cert-check-interval", "0"], "--cert-check-interval: must be greater than 0"),
    (["dispatcher", "--probe-interval", "x"], "--probe-interval: expected seconds, got 'x'"),
])
def test_bad_durations_name_the_flag_through_the_cli(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_bad_flag_through_the_cli_is_one_line_not_a_traceback(capsys):
    assert main(["planner", "--webhook-port", "huge"]) == 2
    assert capsys.readouterr().err == "error: --webhook-port: expected a port number or 'off', got 'huge'\n"


def test_json_log_lines_carry_service_and_extra_fields():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "plan handled %s", ("ok",), None)
    record.trainjob = "ns/job"
    line = json.loads(JsonFormatter("applier").format(record))
    assert line["service"] == "applier" and line["msg"] == "plan handled ok"
    assert line["trainjob"] == "ns/job" and line["level"] == "info"


async def test_readyz_follows_the_checks_and_metrics_are_served():
    state = {"nats": False}
    server = HealthServer("127.0.0.1", 0)
    server.add_check("nats", lambda: state["nats"])
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).text == "ok\n"
            not_ready = await client.get("/readyz")
            assert (not_ready.status_code, not_ready.text) == (503, "not ready: nats\n")
            state["nats"] = True
            assert (await client.get("/readyz")).status_code == 200
            # A check that must ask something (the API server) is asked when readiness is.
            asked = []

            async def api() -> bool:
                asked.append(1)
                return len(asked) > 1

            server.add_check("apiserver", api)
            assert (await client.get("/readyz")).text == "not ready: apiserver\n" and len(asked) == 1
            assert (await client.get("/readyz")).status_code == 200 and len(asked) == 2
            assert "controller_runtime_reconcile_total" in (await client.get("/metrics")).text
    finally:
        await server.stop()
