"""An executor from a package outside corral: it registers in the `corral.executors`
entry-point group and nothing else, and settings, the CLI, the client and serve take it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import clean_env, run_corral
from tests.support.wait import PATIENCE, eventually_sync

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""A package outside corral: its executor finishes every launch at once."""
from corral.executors.registry import Registration
from tests.support.noop import NoopExecutor


class Instant(NoopExecutor):
    kind = "instant"


REGISTRATION = Registration(
    kind="instant",
    summary="finishes at once",
    build=lambda settings, clock: Instant(clock=clock),
)
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder with the plug-in installed (a distribution with one entry point) and a
    migrated corral database."""
    packages = tmp_path / "site"
    (packages / "corral_instant").mkdir(parents=True)
    (packages / "corral_instant" / "__init__.py").write_text(PLUGIN)
    info = packages / "corral_instant-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corral-instant\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[corral.executors]\ninstant = corral_instant:REGISTRATION\n"
    )
    (tmp_path / "corral.toml").write_text('[executors]\nenabled = ["process", "instant"]\n')
    run_corral(tmp_path, "db", "upgrade", env=env(tmp_path), check=True)
    return tmp_path


def env(folder: Path) -> dict[str, str]:
    return clean_env({"PYTHONPATH": os.pathsep.join([str(folder / "site"), str(ROOT)])})


def test_a_registered_executor_runs_jobs_and_nothing_else_names_it(site: Path) -> None:
    plugged = env(site)
    assert "instant" in run_corral(site, "submit", "--help", env=plugged, check=True).stdout
    run_corral(site, "check", env=plugged, check=True)
    job_id = run_corral(
        site, "submit", "--executor", "instant", "--json", "--spec", "{}", env=plugged, check=True
    ).stdout
    job_id = str(json.loads(job_id)["id"])
    server = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve"],
        cwd=site,
        env=plugged,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    show = ("jobs", "show", job_id, "--json")
    try:
        eventually_sync(
            lambda: (
                json.loads(run_corral(site, *show, env=plugged, check=True).stdout)["state"]
                == "succeeded"
            ),
            what="the plug-in's job succeeded",
        )
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=PATIENCE)
    assert "executors: process, instant" in stderr


def test_a_plugin_that_is_not_enabled_says_how_to_enable_it(site: Path) -> None:
    (site / "corral.toml").write_text("")
    refused = run_corral(site, "submit", "--executor", "instant", "--spec", "{}", env=env(site))
    assert refused.returncode == 2
    assert "'instant' is not enabled in this corral" in refused.stderr
    assert '(enabled = ["http", "process", "instant"])' in refused.stderr
