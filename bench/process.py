"""The process executor against a bare Popen loop: how fast `true` jobs drain on the
embedded default (SQLite, the process executor, default settings).

Phases, interleaved over rounds (these machines are noisy: compare the ratio of one run):
  * bare: a loop that starts `true` with subprocess.Popen, at most `--concurrency` at
    once, and waits for each (the floor of any way to run a process per job);
  * corral: `--jobs` jobs of `true` submitted, then drained through the real Dispatcher
    and ProcessExecutor (run folders, the supervisor, the store's run log), timed until
    no job is queued or running. Submitting is not timed;
  * corral_in_memory: the same with the database and run folders on a memory filesystem
    (/dev/shm, when there is one): corral's own cost, without the disk's.

A run creates about ten files and folders, so on a disk where creating a file is slow
corral waits on the disk: `create_us` says what creating a file cost in each place,
measured in each round.

JSON on stdout: jobs/s of each phase per round, their medians, corral/bare and
corral_in_memory/bare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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
    await db.database.migrate()
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(executor="process", spec={"command": COMMAND})
            for _ in range(min(1000, jobs - start))
        ]
        await db.jobs.submit(new=chunk, now=clock.now())
    executor = ProcessExecutor(root=Path(scratch) / "runs", clock=clock)
    await executor.start()
    d = dispatcher.Dispatcher(
        store=db, executors={"process": executor}, clock=clock, settings=config.Settings()
    )
    stop = asyncio.Event()
    t0 = time.perf_counter()
    runner = asyncio.create_task(d.run(stop))
    while await db.jobs.list(model.JobFilter(states=["queued", "running"]), limit=1):
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - t0
    stop.set()
    await runner
    await executor.close()
    ended = await db.jobs.list(model.JobFilter(states=["succeeded"]), limit=jobs)
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


MEMORY = Path("/dev/shm")


def memory_scratch() -> Path | None:
    """A folder for the in-memory phase, or None where there is no memory filesystem."""
    if not (MEMORY.is_dir() and os.access(MEMORY, os.W_OK)):
        return None
    return Path(tempfile.mkdtemp(prefix="corral-bench-", dir=MEMORY))


def create_us(folder: Path, files: int = 300) -> float:
    """Microseconds to create (and close) one empty file in `folder`: the mean of `files`."""
    probe = Path(tempfile.mkdtemp(prefix="create-", dir=folder))
    t0 = time.perf_counter()
    for i in range(files):
        os.close(os.open(probe / str(i), os.O_WRONLY | os.O_CREAT, 0o644))
    spent = time.perf_counter() - t0
    shutil.rmtree(probe)
    return spent / files * 1e6


def run_round(
    n: int, args: argparse.Namespace, scratch: Path, memory: Path | None
) -> dict[str, Any]:
    """Every phase, in an order that alternates from round to round."""
    scratch.mkdir()
    folders = {"corral": scratch}
    if memory is not None:
        folders["corral_in_memory"] = memory / scratch.name
        folders["corral_in_memory"].mkdir()
    names = ["bare", *folders]
    rates = {}
    for name in names if n % 2 == 0 else names[::-1]:
        rates[name] = (
            bare_phase(args.jobs, args.concurrency)
            if name == "bare"
            else corral_phase(args.jobs, str(folders[name]))
        )
        print(f"round {n + 1}/{args.rounds} {name}: {rates[name]:,.0f} jobs/s", file=sys.stderr)
    ratios = {f"{name}_vs_bare": rates[name] / rates["bare"] for name in folders}
    creates = {
        "disk" if name == "corral" else "memory": create_us(f) for name, f in folders.items()
    }
    return {"round": n + 1, "jobs_per_s": rates, "ratio": ratios, "create_us": creates}


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
    memory = memory_scratch()
    try:
        with tempfile.TemporaryDirectory(prefix="corral-bench-") as scratch:
            rounds = [
                run_round(n, args, Path(scratch) / f"round-{n + 1}", memory)
                for n in range(args.rounds)
            ]
    finally:
        if memory is not None:
            shutil.rmtree(memory, ignore_errors=True)
    phases = rounds[0]["jobs_per_s"]
    median = {k: statistics.median(r["jobs_per_s"][k] for r in rounds) for k in phases}
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
        "ratio_corral_in_memory_vs_bare": (
            median["corral_in_memory"] / median["bare"] if "corral_in_memory" in median else None
        ),
        "create_us_median": {
            k: statistics.median(r["create_us"][k] for r in rounds) for k in rounds[0]["create_us"]
        },
        "ratio_by_round": [r["ratio"] for r in rounds],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
