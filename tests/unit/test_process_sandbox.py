"""Uids for strangers' attempts: leased, so two supervisors never give out one at once,
and a range in use says so as a shortage (the launch is tried again), not a failure."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corral.executors import process_sandbox

UID = 4_000_123_456  # no process of this host runs as it


def test_a_leased_uid_is_given_to_no_one_else_until_its_lease_ends(tmp_path: Path) -> None:
    uid, lease = process_sandbox.pick_uid(UID, UID, (), tmp_path / ".uids")
    assert uid == UID
    with pytest.raises(BlockingIOError) as refused:
        process_sandbox.pick_uid(UID, UID, (), tmp_path / ".uids")  # another supervisor
    assert refused.value.errno == errno.EAGAIN  # a shortage: the launch is tried again
    os.close(lease)
    again, lease = process_sandbox.pick_uid(UID, UID, (), tmp_path / ".uids")
    os.close(lease)
    assert again == UID


def test_uids_of_attempts_starting_are_taken(tmp_path: Path) -> None:
    with pytest.raises(BlockingIOError, match=f"every uid of {UID}-{UID + 1}"):
        process_sandbox.pick_uid(UID, UID + 1, (UID, UID + 1), tmp_path)
    uid, lease = process_sandbox.pick_uid(UID, UID + 1, (UID,), tmp_path)
    os.close(lease)
    assert uid == UID + 1
