"""A stopped service ends without the interpreter's teardown (0.3-0.6 s of CPU per process at
every stop), and still leaves what a normal exit leaves: its exit status, its atexit callbacks
run (OpenTelemetry flushes spans there), its logs and standard output flushed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import atexit, logging, sys
from trainyard.eventloop import exit_process
log_file, marker = sys.argv[1], sys.argv[2]
handler = logging.FileHandler(log_file)
logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.INFO)
atexit.register(lambda: open(marker, "w").write("ran"))
logging.info("stopped")
sys.stdout.write("last words")  # buffered: no newline, no flush
exit_process(3)
"""


def test_exit_status_atexit_callbacks_logs_and_output_survive(tmp_path: Path) -> None:
    log_file, marker = tmp_path / "service.log", tmp_path / "atexit"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log_file), str(marker)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "last words"
    assert marker.read_text() == "ran"
    assert log_file.read_text() == "stopped\n"
    assert done.stderr == ""
