"""How a container process enters its pod (isolated mode): the pod's network namespace
(``nsenter``), then a private mount + UTS namespace (``unshare``) where a shell binds the pod's
hosts file, resolver and volumes at their paths and sets the hostname before exec'ing the
command. Without root or ``unshare`` containers run as plain processes of this machine.
"""
from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from .volumes import Mount


def isolated_mounts() -> bool:
    """Whether processes can get a private mount namespace here (root and ``unshare``)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def resolv_conf(namespace: str) -> str:
    """The pod resolver: the cluster search list, and a local nameserver that fails fast.

    Names are answered from the per-pod hosts file; the nameserver entry only makes lookups
    that miss it (e.g. IPv6 queries) fail at once instead of timing out.
    """
    return (f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
            "nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n")


def wrapper_script(hosts_file: Path | None, hostname: str, mounts: list[Mount],
                   working_dir: str, resolv_file: Path | None = None) -> str:
    """Shell run inside the new mount/UTS namespace before exec'ing the container command."""
    q = shlex.quote
    lines = ["set -e"]
    if hosts_file is not None:
        lines.append(f"mount --bind {q(str(hosts_file))} /etc/hosts")
    if resolv_file is not None and os.path.exists("/etc/resolv.conf"):
        lines.append(f"mount --bind {q(str(resolv_file))} /etc/resolv.conf")
    lines.append(f"hostname {q(hostname[:63])}")
    for mount in mounts:
        lines.append(f"mount --bind {q(mount.source)} {q(mount.target)}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {q(mount.target)}")
    lines.append(f"cd {q(working_dir)}")
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def entered_command(script: Path, argv: list[str], netns_path: str | None) -> list[str]:
    """``argv`` run by ``script`` in a private mount + UTS namespace, inside ``netns_path`` if any."""
    command = ["unshare", "--mount", "--uts", "--propagation", "private", "--",
               "/bin/sh", str(script), *argv]
    if netns_path:
        command = ["nsenter", f"--net={netns_path}", "--", *command]
    return command
