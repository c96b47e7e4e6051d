"""`--metrics HOST:PORT`: a loop run alone (`corral dispatcher`) serves its metrics for
Prometheus on a real port; a bad address is refused naming the option."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.test_cli import stopped
from tests.support.cli import Run, corral_env
from tests.support.net import free_port
from tests.support.wait import eventually_sync


def samples(url: str) -> dict[str, float]:
    """The unlabelled samples (and the counts of labelled ones, summed) at `url`."""
    try:
        r = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            found[s.name] = found.get(s.name, 0.0) + s.value
    return found


def test_the_dispatcher_serves_its_metrics_on_a_port_of_its_own(
    corral: Run, tmp_path: Path
) -> None:
    job_id = corral("submit", "--queue", "etl", "--", "true").stdout.strip()
    url = f"http://127.0.0.1:{free_port()}/metrics"
    address = url.removeprefix("http://").removesuffix("/metrics")
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "dispatcher", "--metrics", address],
        cwd=tmp_path,
        env=corral_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = eventually_sync(
            lambda: (
                (got := samples(url)).get("corral_completions_total", 0) >= 1
                and got.get("corral_settle_duration_seconds_count", 0) >= 1
                and got
            ),
            what=f"job {job_id}'s completion counted at {url}",
        )
        assert seen["corral_claim_duration_seconds_count"] >= 1
        assert seen["corral_tick_duration_seconds_count"] >= 1
        assert "corral_jobs" not in seen  # read from the store by the API's /metrics only
    finally:
        stopped(proc)


def test_a_bad_metrics_address_is_refused_naming_the_option(corral: Run) -> None:
    for command in ("dispatcher", "reconciler", "serve"):
        bad = corral(command, "--metrics", "localhost", check=False)
        assert bad.returncode == 2, bad.stderr
        assert "--metrics" in bad.stderr
        assert "HOST:PORT" in bad.stderr


def test_a_metrics_port_already_taken_is_refused_naming_the_option(corral: Run) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = corral("dispatcher", "--metrics", f"127.0.0.1:{port}", check=False)
    assert said.returncode != 0
    assert f"--metrics: could not listen on 127.0.0.1:{port}" in said.stderr
