"""`corral api --workers N`: one socket served by N processes, stopped together by a
signal to the parent, and taken down together when one of them dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.cli import Run, corral_env
from tests.support.net import free_port
from tests.support.procs import alive
from tests.support.wait import PATIENCE, eventually_sync


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def api_loops(corral: Run) -> set[int]:
    said = json.loads(corral("status", "--json").stdout)
    return {
        loop["pid"] for loop in said["loops"] if loop["kind"] == "api" and loop["state"] == "live"
    }


def start(tmp_path: Path, workers: int) -> tuple[subprocess.Popen[str], str]:
    """`corral api --workers N` once it answers and each of its workers is recorded."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "api", "--http", f"127.0.0.1:{port}",
         "--workers", str(workers)],
        cwd=tmp_path, env=corral_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + PATIENCE
    while len(children(proc.pid)) < workers or not _answers(port):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "corral api --workers did not start"
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_workers_share_the_socket_and_a_sigterm_to_the_parent_ends_them_all(
    corral: Run, tmp_path: Path
) -> None:
    proc, base = start(tmp_path, 2)
    workers = children(proc.pid)
    try:
        assert len(workers) == 2
        eventually_sync(
            lambda: api_loops(corral) == workers, what="each worker recorded as an api loop"
        )
        for _ in range(20):  # a new connection each: whichever worker is free takes it
            assert httpx.get(f"{base}/healthz", timeout=30).json() == {"status": "ok"}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 0, err
    assert not any(alive(pid) for pid in workers), "no worker outlives its parent"
    assert err.count("corral: the dashboard:") == 1, (
        "where it serves is said once, not by each worker"
    )


def test_a_worker_that_dies_takes_the_others_down_for_the_supervisor(
    corral: Run, tmp_path: Path
) -> None:
    proc, _ = start(tmp_path, 2)
    first, second = sorted(children(proc.pid))
    os.kill(first, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=PATIENCE)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert f"(pid {first}) ended with status 137 while the others served" in err
    assert not alive(second), "the other worker is stopped, not left serving alone"


def test_workers_out_of_range_are_refused_naming_the_option(corral: Run) -> None:
    for given in ("0", "65", "two"):
        refused = corral("api", "--http", f"127.0.0.1:{free_port()}", "--workers", given,
                         check=False)  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "--workers" in refused.stderr
