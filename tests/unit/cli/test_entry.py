"""The single `trainyard` entry point behaves like a command line users can trust."""
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_usage_and_exits_zero() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "usage: trainyard" in result.stdout


def test_unknown_command_is_a_clear_error_not_a_traceback() -> None:
    result = run_cli("no-such-command")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    assert "Traceback" not in result.stderr
