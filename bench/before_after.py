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


def one_round(tree: Path, jobs: int, pg_url: str | None) -> float:
    """Corral's jobs/s in one round of `tree`'s bench/peers.py, on `tree`'s own code."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    server = ["--pg-url", pg_url] if pg_url else []
    ran = subprocess.run(
        [sys.executable, str(tree / "bench" / "peers.py"), "--jobs", str(jobs), "--rounds", "1",
         "--pgqueuer-drivers", "psycopg", *server],
        env=env, capture_output=True, text=True, check=False, cwd=tree,
    )  # fmt: skip
    if ran.returncode != 0:
        raise SystemExit(f"bench/peers.py of {tree} failed:\n{ran.stderr[-3000:]}")
    said: float = json.loads(ran.stdout)["median"]["jobs_per_s"]["corral"]
    return said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pg-url", help="the server peers.py makes its databases on")
    given = parser.parse_args()
    rounds: dict[str, list[float]] = {"before": [], "after": []}
    for n in range(given.rounds):
        for side in ("before", "after") if n % 2 == 0 else ("after", "before"):
            rounds[side].append(one_round(getattr(given, side).resolve(), given.jobs, given.pg_url))
            print(f"round {n + 1}: {side} {rounds[side][-1]:,.0f} jobs/s", file=sys.stderr)
    medians = {side: statistics.median(values) for side, values in rounds.items()}
    print(json.dumps({
        "jobs": given.jobs,
        "corral_jobs_per_s": rounds,
        "median": medians,
        "ratio_after_vs_before": medians["after"] / medians["before"],
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
