"""Object UIDs: version-4 UUIDs from a pool of kernel random bytes (services/devcluster/apiserver/registry/uids.py)."""
from __future__ import annotations

import os
import uuid

from trainyard_services.devcluster.apiserver.registry.uids import new_uid


def test_uids_are_random_version_4_uuids_and_never_repeat_across_pool_refills():
    uids = [new_uid() for _ in range(2000)]  # several refills of the pool
    assert len(set(uids)) == len(uids)
    for text in uids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text


def test_a_forked_child_does_not_hand_out_its_parents_next_uids():
    new_uid()  # the pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next UIDs, to the parent
        os.close(read)
        os.write(write, ",".join(new_uid() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [new_uid() for _ in range(3)]
    assert len(child) == 3 and not set(child) & set(parent)
