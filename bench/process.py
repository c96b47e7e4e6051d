"""The process executor against a bare Popen loop: how fast `true` jobs drain on the
embedded default (SQLite, the process executor, default settings).

Phases, interleaved over rounds (these machines are noisy: compare the ratio of one run):
  * bare: a loop that starts `true` with subprocess.Popen, at most `--concurrency` at
    once, and waits for each (the floor of any way to run a process per job);
  * corral: `--jobs` jobs of `true` submitted, then drained through the real Dispatcher
    and ProcessExecutor (run folders, a shim per run, the store's run log), timed until
    no job is queued or running. Submitting is not timed.

JSON on stdout: jobs/s of each phase per round, their medians, and corral/bare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral import config, dispatcher, model, store
from corral.clock import SystemClock
from corral.executors.process import ProcessExecutor

COMMAND = ["true"]


def bare_phase(jobs: int, concurrency: int) -> float:
    """jobs/s of a Popen loop with at most `concurrency` running, oldest waited first."""
    running: list[subprocess.Popen[bytes]] = []
    started = done = 0
    t0 = time.perf_counter()
    while done < jobs:
        while started < jobs and len(running) < concurrency:
            running.append(subprocess.Popen(COMMAND))
            started += 1
        running.pop(0).wait()
        done += 1
    return jobs / (time.perf_counter() - t0)


async def _corral_phase(jobs: int, scratch: str) -> float:
    clock = SystemClock()
    db = store.Store.connect(f"sqlite:///{scratch}/bench.db")
    await db.migrate()
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(executor="process", spec={"command": COMMAND})
            for _ in range(min(1000, jobs - start))
        ]
        await db.job_submit(new=chunk, now=clock.now())
    executor = ProcessExecutor(root=Path(scratch) / "runs", clock=clock)
    await executor.start()
    d = dispatcher.Dispatcher(
        store=db, executors={"process": executor}, clock=clock, settings=config.Settings()
    )
    stop = asyncio.Event()
    t0 = time.perf_counter()
    runner = asyncio.create_task(d.run(stop))
    while await db.job_list(states=["queued", "running"], limit=1):
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - t0
    stop.set()
    await runner
    await executor.close()
    ended = await db.job_list(states=["succeeded"], limit=jobs)
    await db.close()
    assert len(ended) == jobs, f"{len(ended)} of {jobs} succeeded"
    return jobs / elapsed


def corral_phase(jobs: int, scratch: str | None = None) -> float:
    """jobs/s of corral on `jobs` jobs, its files in `scratch` (default: a new folder,
    removed afterwards). The benchmark removes every round's folders only at its end: a
    removal makes the filesystem busy (it frees blocks, discards them) for the next round."""
    if scratch is not None:
        return asyncio.run(_corral_phase(jobs, scratch))
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as made:
        return asyncio.run(_corral_phase(jobs, made))


def run_round(n: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Both phases, in an order that alternates from round to round."""
    scratch.mkdir()
    rates = {}
    for name in ["bare", "corral"] if n % 2 == 0 else ["corral", "bare"]:
        rates[name] = (
            bare_phase(args.jobs, args.concurrency)
            if name == "bare"
            else corral_phase(args.jobs, str(scratch))
        )
        print(f"round {n + 1}/{args.rounds} {name}: {rates[name]:,.0f} jobs/s", file=sys.stderr)
    return {"round": n + 1, "jobs_per_s": rates, "ratio": rates["corral"] / rates["bare"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=config.Settings().launch_concurrency,
        help="The bare loop's (default: corral's launch_concurrency).",
    )
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as scratch:
        rounds = [run_round(n, args, Path(scratch) / f"round-{n + 1}") for n in range(args.rounds)]
    median = {k: statistics.median(r["jobs_per_s"][k] for r in rounds) for k in ("bare", "corral")}
    report = {
        "jobs": args.jobs,
        "command": COMMAND,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rounds_detail": rounds,
        "median_jobs_per_s": median,
        "ratio_corral_vs_bare": median["corral"] / median["bare"],
        "ratio_by_round": [r["ratio"] for r in rounds],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
