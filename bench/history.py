"""Finished history against what it costs to run: `corral serve`'s memory and the
reconciler's pass with 1,000 and with 100,000 finished runs kept (the process executor
keeps run folders 7 days, and the store keeps every job).

For each size, in one scratch folder (SQLite, the process executor, default settings but
a pass every second):
  * jobs of `true` are submitted until the store holds that many, and a `corral serve`
    drains them (not timed; its peak RSS is reported as `drain_peak_rss_mb`);
  * a fresh `corral serve` runs over that history for `--settle` seconds, its reconciler
    making a pass every second, and its peak RSS is read (`serve_rss_mb`);
  * the reconciler's pass is timed in this process over the same database and run
    folders (`pass_ms`, the median of `--passes`), and so, for contrast, is listing the
    whole history (`list_all_ms`: what a pass read before the indexes of live and ended
    runs).

JSON on stdout: the figures of each size, and the ratios of the big one to the small one
(the targets: serve_rss and pass within 1.2x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral import config, model, reconciler, store
from corral.clock import SystemClock
from corral.executors.process import ProcessExecutor

COMMAND = ["true"]
PATIENCE = 1800.0
"""How long a drain may take before the benchmark gives up (a slow disk)."""


def _serve(scratch: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CORRAL_DATABASE_URL": f"sqlite:///{scratch}/corral.db",
        "CORRAL_STATE_DIR": str(scratch / "state"),
        "CORRAL_RECONCILE_INTERVAL": "1s",
        "CORRAL_LOG_LEVEL": "WARNING",
        "CORRAL_HEALTH_FILE": str(scratch / "health.json"),
    }
    (scratch / "health.json").unlink(missing_ok=True)
    log = (scratch / "serve.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "corral", "serve"], env=env, stdout=log, stderr=log
    )


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def _stop(serve: subprocess.Popen[bytes]) -> None:
    serve.send_signal(signal.SIGTERM)
    if serve.wait(timeout=120) != 0:
        raise RuntimeError(f"corral serve exited with {serve.returncode}: see serve.log")


async def _fill(db: store.Store, jobs: int) -> None:
    clock = SystemClock()
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(executor="process", spec={"command": COMMAND})
            for _ in range(min(1000, jobs - start))
        ]
        await db.jobs.submit(new=chunk, now=clock.now())


async def _wait_drained(db: store.Store, serve: subprocess.Popen[bytes]) -> None:
    until = time.monotonic() + PATIENCE
    while await db.jobs.list(model.JobFilter(states=["queued", "running"]), limit=1):
        if serve.poll() is not None:
            raise RuntimeError(f"corral serve exited with {serve.returncode}: see serve.log")
        if time.monotonic() > until:
            raise RuntimeError(f"not drained in {PATIENCE:.0f} s")
        await asyncio.sleep(0.5)


async def _ready(scratch: Path, serve: subprocess.Popen[bytes]) -> None:
    """Once every loop of `serve` has made its first round (its health file appears)."""
    until = time.monotonic() + PATIENCE
    while not (scratch / "health.json").exists():
        if serve.poll() is not None:
            raise RuntimeError(f"corral serve exited with {serve.returncode}: see serve.log")
        if time.monotonic() > until:
            raise RuntimeError(f"not ready in {PATIENCE:.0f} s")
        await asyncio.sleep(0.1)


async def _timed_passes(scratch: Path, passes: int) -> tuple[float, float]:
    """(median ms of a reconciler pass, ms to list every run folder)."""
    clock = SystemClock()
    db = store.Store.connect(f"sqlite:///{scratch}/corral.db")
    executor = ProcessExecutor(root=scratch / "state" / "runs", clock=clock)
    await executor.start()
    r = reconciler.Reconciler(
        store=db, executors={"process": executor}, clock=clock, settings=config.Settings()
    )
    times = []
    try:
        await r.run_once()  # warm: the same caches a running reconciler has
        for _ in range(passes):
            t0 = time.perf_counter()
            await r.run_once()
            times.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        everything = await executor.list_managed({})
        list_all = (time.perf_counter() - t0) * 1000
    finally:
        await executor.close()
        await db.close()
    assert everything, "the history is there"
    return statistics.median(times), list_all


async def measure(scratch: Path, total: int, settle: float, passes: int) -> dict[str, Any]:
    """Grow the history in `scratch` to `total` finished runs, then measure."""
    db = store.Store.connect(f"sqlite:///{scratch}/corral.db")
    await db.database.migrate()
    have = len(await db.jobs.list(model.JobFilter(states=["succeeded"]), limit=total))
    await _fill(db, total - have)
    serve = _serve(scratch)
    try:
        await _wait_drained(db, serve)
    finally:
        drain_peak = _peak_rss_mb(serve.pid)
        _stop(serve)
    finished = len(await db.jobs.list(model.JobFilter(states=["succeeded"]), limit=total + 1))
    assert finished == total, f"{finished} of {total} succeeded"
    await db.close()
    runs = scratch / "state" / "runs"
    folders = sum(1 for e in os.scandir(runs) if not e.name.startswith("."))
    assert folders == total, f"{folders} run folders, not {total}"

    serve = _serve(scratch)
    try:
        await _ready(scratch, serve)  # its settle counts from there, not from a slow start
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            if serve.poll() is not None:
                raise RuntimeError(f"corral serve exited with {serve.returncode}")
            await asyncio.sleep(0.25)
        rss = _peak_rss_mb(serve.pid)
    finally:
        _stop(serve)
    pass_ms, list_all_ms = await _timed_passes(scratch, passes)
    return {
        "finished_runs": total,
        "serve_rss_mb": round(rss, 1),
        "drain_peak_rss_mb": round(drain_peak, 1),
        "pass_ms": round(pass_ms, 2),
        "list_all_ms": round(list_all_ms, 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-history-") as scratch:
        small = await measure(Path(scratch), args.small, args.settle, args.passes)
        big = await measure(Path(scratch), args.big, args.settle, args.passes)
    return {
        "small": small,
        "big": big,
        "ratio_serve_rss_big_vs_small": round(big["serve_rss_mb"] / small["serve_rss_mb"], 3),
        "ratio_pass_big_vs_small": round(big["pass_ms"] / small["pass_ms"], 3),
        "ratio_list_all_big_vs_small": round(big["list_all_ms"] / small["list_all_ms"], 1),
        "targets": {"ratio_serve_rss_big_vs_small": 1.2, "ratio_pass_big_vs_small": 1.2},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1_000, help="finished runs, first")
    parser.add_argument("--big", type=int, default=100_000, help="finished runs, then")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of a fresh serve")
    parser.add_argument("--passes", type=int, default=9, help="timed reconciler passes")
    args = parser.parse_args()
    if args.big <= args.small:
        parser.error("--big must be more than --small")
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
