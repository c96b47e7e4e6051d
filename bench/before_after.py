"""Corral's throughput in bench/peers.py before and after a change, measured in turns.

Two source trees (a checkout before the change and one after) each run bench/peers.py for
one round at a time, alternately, so that the machine's noise falls on both alike; the
JSON printed holds every round's corral jobs/s, the medians and their ratio:

    python bench/before_after.py --before ../before --after . --rounds 3 --jobs 10000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def one_round(tree: Path, jobs: int, pg_url: str | None) -> tuple[float, float]:
    """Corral's jobs/s, and its dispatcher's CPU a job (µs), in one round of `tree`'s
    bench/peers.py, on `tree`'s own code."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    server = ["--pg-url", pg_url] if pg_url else []
    ran = subprocess.run(
        [sys.executable, str(tree / "bench" / "peers.py"), "--jobs", str(jobs), "--rounds", "1",
         "--pgqueuer-drivers", "psycopg", *server],
        env=env, capture_output=True, text=True, check=False, cwd=tree,
    )  # fmt: skip
    if ran.returncode != 0:
        raise SystemExit(f"bench/peers.py of {tree} failed:\n{ran.stderr[-3000:]}")
    said = json.loads(ran.stdout)["median"]
    return float(said["jobs_per_s"]["corral"]), float(said["corral_cpu_us_per_job"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pg-url", help="the server peers.py makes its databases on")
    given = parser.parse_args()
    rounds: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    for n in range(given.rounds):
        for side in ("before", "after") if n % 2 == 0 else ("after", "before"):
            rate, us = one_round(getattr(given, side).resolve(), given.jobs, given.pg_url)
            rounds[side].append(rate)
            cpu[side].append(us)
            print(f"round {n + 1}: {side} {rate:,.0f} jobs/s, {us:.1f} µs a job", file=sys.stderr)
    medians = {side: statistics.median(values) for side, values in rounds.items()}
    cpu_medians = {side: statistics.median(values) for side, values in cpu.items()}
    print(json.dumps({
        "jobs": given.jobs,
        "corral_jobs_per_s": rounds,
        "corral_cpu_us_per_job": cpu,
        "median": medians,
        "median_cpu_us_per_job": cpu_medians,
        "ratio_after_vs_before": medians["after"] / medians["before"],
        "ratio_cpu_after_vs_before": cpu_medians["after"] / cpu_medians["before"],
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
