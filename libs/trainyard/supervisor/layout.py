"""Where a stack keeps its files inside its data directory.

Everything a stack writes lives under one directory, so a second `trainyard up` on the same
directory resumes with everything kept (NATS JetStream files, devcluster's SQLite store) and
`trainyard down` finds the processes to stop.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "TRAINYARD_DATA_DIR"


def default_data_dir() -> Path:
    """`$TRAINYARD_DATA_DIR`, else `~/.trainyard` (like `~/.kube`, easy to find and delete)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".trainyard"


@dataclass(frozen=True)
class StackLayout:
    root: Path

    @classmethod
    def at(cls, data_dir: str | os.PathLike[str]) -> StackLayout:
        return cls(Path(data_dir).expanduser().resolve())

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig users point kubectl and the SDK at."""
        return self.root / "kubeconfig"

    @property
    def pid_file(self) -> Path:
        """The supervisor's pid (plain text), for `trainyard down`."""
        return self.root / "trainyard.pid"

    @property
    def state_file(self) -> Path:
        """JSON: ports, every child's pid and start time, readiness."""
        return self.root / "stack.json"

    @property
    def lock_file(self) -> Path:
        """Held (flock) by the running supervisor: one stack per data dir."""
        return self.root / ".lock"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log_file(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    @property
    def nats_dir(self) -> Path:
        return self.root / "nats"

    @property
    def devcluster_dir(self) -> Path:
        return self.root / "devcluster"

    def cluster_dir(self, name: str) -> Path:
        """A worker cluster's directory (`up --workers`): its devcluster data and kubeconfig."""
        return self.root / "clusters" / name

    def create(self) -> None:
        for directory in (self.root, self.logs_dir, self.nats_dir, self.devcluster_dir):
            directory.mkdir(parents=True, exist_ok=True)
