"""Each `corral` command imports only what it needs, so that it starts at once: no
settings or database library for a help page, no Alembic (a migration tool) for a
command that reads or stores jobs, no PostgreSQL driver on SQLite, no Kubernetes client
unless a job goes to a cluster. (How long each takes is bench/cli_start.py's business.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral import cli
from tests.support.cli import run_corral

WATCHED = (
    "alembic",
    "hera",
    "httpx",
    "kubernetes",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "sqlalchemy",
    "yaml",
)


def imported(args: list[str], cwd: Path, **env: str) -> set[str]:
    """The watched packages that `corral ARGS` imported; it must succeed."""
    script = (
        "import json, runpy, sys\n"
        "out, args = sys.argv[1], json.loads(sys.argv[2])\n"
        "sys.argv = ['corral', *args]\n"
        "try:\n"
        "    runpy.run_module('corral', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "open(out, 'w').write(json.dumps([sorted(sys.modules), code]))\n"
    )
    out = cwd / "imported.json"
    done = subprocess.run(
        [sys.executable, "-c", script, str(out), json.dumps(args)],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.exists(), done.stderr[-2000:]
    modules, code = json.loads(out.read_text())
    assert code in (0, None), f"corral {' '.join(args)} exited {code}: {done.stderr[-2000:]}"
    return {m.split(".")[0] for m in modules} & set(WATCHED)


@pytest.fixture
def sqlite_env(tmp_path: Path) -> dict[str, str]:
    env = {"CORRAL_DATABASE_URL": f"sqlite:///{tmp_path / 'corral.db'}"}
    run_corral(tmp_path, "db", "upgrade", env={**os.environ, **env}, check=True)
    return env


@pytest.mark.parametrize(
    "args",
    [["--help"], ["submit", "--help"], ["jobs", "list", "--help"], ["tenants", "list", "--help"]],
)
def test_a_help_page_imports_no_settings_or_database_library(
    args: list[str], tmp_path: Path
) -> None:
    assert imported(args, tmp_path) == set()


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "list"],
        ["submit", "--", "true"],
        ["jobs", "show", "1"],
        ["dead", "list"],
        ["tenants", "list"],
    ],
)
def test_a_command_on_sqlite_imports_no_migration_tool_driver_or_cluster_client(
    args: list[str], tmp_path: Path, sqlite_env: dict[str, str]
) -> None:
    if args[:2] == ["jobs", "show"]:
        imported(["submit", "--", "true"], tmp_path, **sqlite_env)
    # A cluster executor enabled beside: a process job, or a look at jobs, never needs it.
    enabled = {"CORRAL_EXECUTORS__ENABLED": '["process", "kubernetes"]'}
    assert imported(args, tmp_path, **sqlite_env, **enabled) == {
        "pydantic",
        "pydantic_settings",
        "sqlalchemy",
    }


def test_the_command_list_says_what_each_command_says_of_itself() -> None:
    """`corral --help` imports no command, so it shows their summaries from a table: the
    table must say what each command's own help says."""
    group = cli.main
    ctx = cli.main.make_context("corral", ["--help"], resilient_parsing=True)
    for name, (_, summary) in cli.COMMANDS.items():
        command = group.get_command(ctx, name)
        assert command is not None, name
        assert command.name == name
        assert summary == (command.help or "").split("\n\n")[0].strip(), name
    assert sorted(cli.COMMANDS) == group.list_commands(ctx)
