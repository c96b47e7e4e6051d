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
    corral(tmp_path, "db", "upgrade")
    return tmp_path


def env(folder: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(folder / "site"), str(ROOT)])
    return clean


def corral(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "corral", *args],
        cwd=folder,
        env=env(folder),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_a_registered_executor_runs_jobs_and_nothing_else_names_it(site: Path) -> None:
    assert "instant" in corral(site, "submit", "--help").stdout
    corral(site, "check")
    job_id = corral(site, "submit", "--executor", "instant", "--json", "--spec", "{}").stdout
    job_id = str(json.loads(job_id)["id"])
    server = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve"],
        cwd=site,
        env=env(site),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually_sync(
            lambda: (
                json.loads(corral(site, "jobs", "show", job_id, "--json").stdout)["state"]
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
    refused = corral(site, "submit", "--executor", "instant", "--spec", "{}", check=False)
    assert refused.returncode == 2
    assert "'instant' is not enabled in this corral" in refused.stderr
    assert '(enabled = ["http", "process", "instant"])' in refused.stderr
