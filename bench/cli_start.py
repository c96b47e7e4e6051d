"""How long `corral` commands take to start and end, against bare imports of what they
are built on, and bulk submit against the Python client's own loop.

Start times, each the median of `--runs` (these machines are noisy: the runs of every
command and baseline are interleaved, and the ratios compare figures of one run):
  * `corral --help` against `python -c "import click"`;
  * `corral jobs list` and `corral submit -- true`, on a SQLite database, against
    `python -c "import sqlalchemy, pydantic_settings"` (which is less than either does:
    settings read, database opened, schema checked, a query or a write, output printed);
  * `corral heartbeat` (from inside a job, the one command a job may run every few
    seconds), against the same baseline.

Bulk submit: `corral submit --from-file` of `--bulk` jobs (with idempotency keys), against
the Python client's `submit` called for each of the same jobs in one process (each on a
fresh database): jobs per second, and their ratio.

corral's own modules are compiled to bytecode first, as installing a package does
(a checkout run with PYTHONDONTWRITEBYTECODE would compile them at every start).

JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import corral
from corral import config, runtime, store
from corral.clock import SystemClock

TARGETS = {
    "ratio_help_vs_import_click": 3.0,
    "ratio_jobs_list_vs_import_sqlalchemy_pydantic_settings": 1.5,
    "ratio_submit_vs_import_sqlalchemy_pydantic_settings": 1.5,
    "ratio_bulk_file_vs_client_loop": 0.5,  # at least
}


def corral_command() -> list[str]:
    """The installed `corral` script beside this Python, else `python -m corral`."""
    script = Path(sys.executable).with_name("corral")
    return [str(script)] if script.exists() else [sys.executable, "-m", "corral"]


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return elapsed


def start_times(scratch: Path, runs: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "CORRAL_DATABASE_URL": f"sqlite:///{scratch}/start.db",
        "CORRAL_STATE_DIR": str(scratch / "state"),
    }
    corral = corral_command()
    subprocess.run(
        [*corral, "db", "upgrade"], env=env, cwd=scratch, check=True, capture_output=True
    )
    subprocess.run(
        [*corral, "submit", "--heartbeat", "--", "true"],
        env=env,
        cwd=scratch,
        check=True,
        capture_output=True,
    )
    job_id, fence = asyncio.run(_running(env["CORRAL_DATABASE_URL"]))
    beat_env = {
        **env,
        "CORRAL_JOB_ID": str(job_id),
        "CORRAL_FENCE": str(fence),
        "CORRAL_ATTEMPT": "1",
    }
    cases = {
        "python": ([sys.executable, "-c", "pass"], env),
        "import_click": ([sys.executable, "-c", "import click"], env),
        "import_sqlalchemy_pydantic_settings": (
            [sys.executable, "-c", "import sqlalchemy, pydantic_settings"],
            env,
        ),
        "help": ([*corral, "--help"], env),
        "jobs_list": ([*corral, "jobs", "list"], env),
        "submit": ([*corral, "submit", "--", "true"], env),
        "heartbeat": ([*corral, "heartbeat"], beat_env),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (argv, case_env) in cases.items():
            times[name].append(timed(argv, case_env, scratch))
    ms = {name: round(statistics.median(t) * 1000, 1) for name, t in times.items()}
    base = ms["import_sqlalchemy_pydantic_settings"]
    return {
        "median_ms": ms,
        "ratio_help_vs_import_click": round(ms["help"] / ms["import_click"], 2),
        "ratio_jobs_list_vs_import_sqlalchemy_pydantic_settings": round(ms["jobs_list"] / base, 2),
        "ratio_submit_vs_import_sqlalchemy_pydantic_settings": round(ms["submit"] / base, 2),
        "ratio_heartbeat_vs_import_sqlalchemy_pydantic_settings": round(ms["heartbeat"] / base, 2),
    }


async def _running(url: str) -> tuple[int, int]:
    """(job id, fence) of an attempt made running, as a dispatcher would, for heartbeats."""
    db = store.Store.connect(url)
    try:
        now = SystemClock().now()
        [claimed] = await db.jobs.claim(now=now, limit=1, executors=["process"])
        await db.attempts.record_running(fences=[claimed.attempt.id], now=now)
        return claimed.job.id, claimed.attempt.id
    finally:
        await db.close()


def _jobs(n: int) -> list[dict[str, Any]]:
    return [
        {"spec": {"command": ["echo", str(i)]}, "queue": "bulk", "idempotency_key": f"bulk-{i}"}
        for i in range(n)
    ]


async def _client_loop(url: str, jobs: list[dict[str, Any]]) -> float:
    db = store.Store.connect(url)
    await db.database.migrate()
    await db.close()
    settings = config.Settings(database_url=url)
    async with runtime.connect(settings, platforms=False) as c:
        t0 = time.perf_counter()
        for job in jobs:
            await c.submit(**job)
        return time.perf_counter() - t0


def bulk(scratch: Path, n: int) -> dict[str, Any]:
    jobs = _jobs(n)
    loop_s = asyncio.run(_client_loop(f"sqlite:///{scratch}/loop.db", jobs))
    url = f"sqlite:///{scratch}/file.db"
    env = {**os.environ, "CORRAL_DATABASE_URL": url, "CORRAL_STATE_DIR": str(scratch / "state")}
    corral = corral_command()
    subprocess.run(
        [*corral, "db", "upgrade"], env=env, cwd=scratch, check=True, capture_output=True
    )
    lines = scratch / "jobs.jsonl"
    lines.write_text("".join(json.dumps(job) + "\n" for job in jobs), encoding="utf-8")
    file_s = timed([*corral, "submit", "--from-file", str(lines)], env, scratch)
    return {
        "jobs": n,
        "client_loop_jobs_per_s": round(n / loop_s),
        "from_file_jobs_per_s": round(n / file_s),
        "ratio_bulk_file_vs_client_loop": round(loop_s / file_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command")
    parser.add_argument("--bulk", type=int, default=100_000, help="jobs to submit in bulk")
    args = parser.parse_args()
    compileall.compile_dir(Path(corral.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="corral-cli-") as scratch:
        report = {
            "start": start_times(Path(scratch), args.runs),
            "bulk": bulk(Path(scratch), args.bulk),
            "targets": TARGETS,
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
