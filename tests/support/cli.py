"""The `corral` command as a user runs it, in a subprocess: its environment, and one way to
run it and read what it said, for every test that does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.support.wait import PATIENCE

Run = Callable[..., subprocess.CompletedProcess[str]]
"""The `corral` fixture's type: `corral(*ARGS, env=..., check=...)`, run in the test's folder."""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without corral's settings (no CORRAL_* variable), `extra`
    over it: a corral started on it reads only what the test gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(extra or {})
    return env


def corral_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """`clean_env` with short loop limits (a served job starts and ends within seconds),
    `extra` over them."""
    env = clean_env()
    env["CORRAL_TIMEOUTS__DISPATCH_INTERVAL"] = "200ms"
    env["CORRAL_TIMEOUTS__TICK_DEADLINE"] = "150ms"
    env["CORRAL_TIMEOUTS__TICK_MARGIN"] = "50ms"
    env["CORRAL_TIMEOUTS__OBSERVE_INTERVAL"] = "200ms"
    env["CORRAL_TIMEOUTS__LAUNCH_GRACE"] = "2s"
    env["CORRAL_TIMEOUTS__RECONCILE_INTERVAL"] = "500ms"
    env.update(extra or {})
    return env


def run_corral(
    cwd: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = PATIENCE,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` (`python -m corral` of this interpreter) run to its end in `cwd`, on
    `env` (else `corral_env()`), `stdin` its input: its exit status and what it wrote, as
    text. With `check`, a status other than 0 fails the test, saying the command and its
    stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "corral", *args],
        cwd=cwd,
        env=corral_env() if env is None else dict(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc
