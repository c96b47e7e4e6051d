"""Readying the `process` executor's root for tenants' commands, which run as strangers
(a uid of their own from executors.process.uid_range, or in a sandbox: process_sandbox.py):
the path from the state folder down to the run folders opened to them, and a probe that
such a command can start here. A setting that cannot work is a ConfigError at start-up,
not a failure of every tenant's launch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral import errors
from corral.executors import process_runs, process_sandbox

log = logging.getLogger("corral.executors.process")


def prepare(root: Path, strangers: Mapping[str, Any], state_dir: Path | None) -> None:
    """Check that tenants' commands can run as strangers here (ConfigError, naming the
    setting, if not), and open the path from the state folder down to the run folders
    to them: 0711, so that a command reaches its own work folder and lists nothing.
    `strangers`: `uids` [first, last], `sandbox`, `hide`, `shown` (paths it must see)."""
    uids = strangers.get("uids")
    if uids is not None:
        shown = [Path(p) for p in strangers.get("shown", ())]
        closed = _open_paths(root, shown, state_dir)
        if closed is not None:
            raise errors.ConfigError(
                f"process executor: executors.process.uid_range: {closed} is closed to"
                f" other users, so tenants' commands could not reach their run folders"
                f" ({root}) and the attempt socket: chmod o+x {closed}, or set"
                " executors.process.root and state_dir elsewhere"
            )
    why = process_sandbox.probe(
        uid_range=None if uids is None else (uids[0], uids[1]),
        sandbox=strangers.get("sandbox"),
        scratch=root / f".probe-{os.getpid()}",  # where run folders are
    )
    if why is not None:
        raise errors.ConfigError(f"process executor: {why}")
    log.info("process executor: tenants' commands run %s", process_sandbox.describe(strangers))


def _open_paths(root: Path, shown: list[Path], state_dir: Path | None) -> Path | None:
    """Open `root`, its parents within `state_dir`, and the `shown` folders to other
    users (0711); the first folder on their way that stays closed, or None."""
    with process_runs.os_errors(f"open the path to {root} to tenants' commands"):
        os.chmod(root, 0o711)
        for folder in root.parents:
            if state_dir is None or not folder.is_relative_to(state_dir):
                break
            os.chmod(folder, 0o711)
        if state_dir is not None and state_dir.is_dir():
            os.chmod(state_dir, 0o711)  # to the attempt socket's folder too
        for folder in shown:
            folder.mkdir(mode=0o711, parents=True, exist_ok=True)
            os.chmod(folder, 0o711)
        return next(
            (c for p in (root, *shown) if (c := process_sandbox.unreachable(p))),
            None,
        )
