"""The stack's state file (stack.json) and pid file: what `trainyard down` and tests read."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.supervisor.layout import StackLayout
from trainyard.supervisor.proctable import ProcessId


@dataclass
class StackState:
    supervisor: ProcessId
    ports: dict[str, int] = field(default_factory=dict)
    children: dict[str, ProcessId] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    ready: bool = False
    kubeconfig: str = ""
    nats_url: str = ""
    api_url: str = ""
    # With workers: every cluster's kubeconfig and API URL by name (the manager included).
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)
    dashboard_url: str = ""
    # The bus's credentials files, one per identity (<identity>.json, 0600): docs/security.md.
    nats_credentials: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "supervisor": self.supervisor.to_json(),
            "ports": self.ports,
            "children": {name: proc.to_json() for name, proc in self.children.items()},
            "restarts": self.restarts,
            "ready": self.ready,
            "kubeconfig": self.kubeconfig,
            "nats_url": self.nats_url,
            "api_url": self.api_url,
            **({"clusters": self.clusters} if self.clusters else {}),
            **({"dashboard_url": self.dashboard_url} if self.dashboard_url else {}),
            **({"nats_credentials": self.nats_credentials} if self.nats_credentials else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackState:
        return cls(
            supervisor=ProcessId.from_json(data["supervisor"]),
            ports={k: int(v) for k, v in (data.get("ports") or {}).items()},
            children={k: ProcessId.from_json(v) for k, v in (data.get("children") or {}).items()},
            restarts={k: int(v) for k, v in (data.get("restarts") or {}).items()},
            ready=bool(data.get("ready")),
            kubeconfig=str(data.get("kubeconfig") or ""),
            nats_url=str(data.get("nats_url") or ""),
            api_url=str(data.get("api_url") or ""),
            clusters={str(k): dict(v) for k, v in (data.get("clusters") or {}).items()},
            dashboard_url=str(data.get("dashboard_url") or ""),
            nats_credentials=str(data.get("nats_credentials") or ""),
        )


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_state(layout: StackLayout, state: StackState) -> None:
    _write_atomically(layout.state_file, json.dumps(state.to_json(), indent=2) + "\n")


def read_state(layout: StackLayout) -> StackState | None:
    try:
        return StackState.from_json(json.loads(layout.state_file.read_text()))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def write_pid_file(layout: StackLayout, pid: int) -> None:
    _write_atomically(layout.pid_file, f"{pid}\n")


def read_pid_file(layout: StackLayout) -> int | None:
    try:
        return int(layout.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
