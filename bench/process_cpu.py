"""The CPU of every process a command runs, by kind: where a test suite's or a demo's CPU goes.

Runs the command and reads every process's CPU time (``/proc/<pid>/stat``: user + system) every
``--interval`` seconds until the command ends; a process is known by its pid and start time,
and its kind comes from its command line (``trainyard planner``, ``nats-server``, ``torchrun``,
``python train.py``, ``kubectl``...). Processes that were running before the command started
count only what they used after. A process that lives shorter than one interval is missed and
one that ends counts up to its last reading, so the total is a lower bound: the line before the
table compares it with the run's core-seconds.

Usage: .venv/bin/python bench/process_cpu.py [--interval 0.25] [--top 30] -- make test
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK")
_TRAINYARD = re.compile(r"trainyard(?:\.cli\.main)?\s+(devcluster\s+\S+|\S+)")


@dataclass(frozen=True)
class Reading:
    command: str
    cpu_s: float


def kind_of(command: str) -> str:
    """What a process is, from its command line (or ``[name]`` for one without, e.g. a thread
    of the kernel or a process that has already exited)."""
    if command.startswith("["):
        return "kernel or exited: " + re.split(r"[/:]", command.strip("[]"))[0]
    words = command.split()
    if not words:
        return "?"
    program = os.path.basename(words[0])
    if program == "nats-server":
        return "nats-server"
    if "-m pytest" in command or "exec(eval(" in command:  # xdist's workers start with exec(eval(...
        return "pytest"
    match = _TRAINYARD.search(command)
    if match and (program.startswith("python") or program == "trainyard"):
        return "trainyard " + " ".join(match.group(1).split())
    if "torchrun" in command:
        return "torchrun"
    if program.startswith("python"):
        scripts = [word for word in words[1:] if not word.startswith("-")]
        return "python " + (os.path.basename(scripts[0]) if scripts else "-c")
    return program


def read_all() -> dict[tuple[int, int], Reading]:
    """Every process now: (pid, start time in ticks) -> its command line and CPU seconds."""
    found: dict[tuple[int, int], Reading] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS
        found[(int(entry), int(fields[19]))] = Reading(command or f"[{name}]", cpu)
    return found


def remember(seen: dict[tuple[int, int], Reading], now: dict[tuple[int, int], Reading]) -> None:
    """Keeps each process's latest CPU reading and the first command line it showed (an exiting
    process loses its command line before its last reading)."""
    for key, reading in now.items():
        earlier = seen.get(key)
        if earlier is not None and not earlier.command.startswith("[") and reading.command.startswith("["):
            reading = Reading(earlier.command, reading.cpu_s)
        seen[key] = reading


def totals(before: dict[tuple[int, int], Reading], seen: dict[tuple[int, int], Reading],
           skip: set[int]) -> tuple[Counter, Counter]:
    """CPU seconds and process counts by kind, less what each process had used before."""
    cpu: Counter = Counter()
    count: Counter = Counter()
    for key, reading in seen.items():
        if key[0] in skip:
            continue
        used = reading.cpu_s - (before[key].cpu_s if key in before else 0.0)
        kind = kind_of(reading.command)
        cpu[kind] += used
        count[kind] += 1
    return cpu, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between readings")
    parser.add_argument("--top", type=int, default=30, help="kinds printed, the most CPU first")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is needed, after --")
    if args.interval <= 0:
        parser.error("--interval: must be above 0")
    before = read_all()
    seen: dict[tuple[int, int], Reading] = {}
    began = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        remember(seen, read_all())
        time.sleep(args.interval)
    wall = time.monotonic() - began
    cpu, count = totals(before, seen, skip={os.getpid()})
    print(f"{' '.join(command)}: exit {child.returncode}, {wall:.0f} s wall, {os.cpu_count()} cores "
          f"({wall * (os.cpu_count() or 1):.0f} core-seconds); processes' CPU read: {sum(cpu.values()):.0f} s",
          file=sys.stderr)
    print(f"{'CPU s':>9} {'processes':>9}  kind", file=sys.stderr)
    for kind, seconds in cpu.most_common(args.top):
        print(f"{seconds:9.1f} {count[kind]:9d}  {kind}", file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
