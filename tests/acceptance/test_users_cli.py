"""`corral users add | list | remove` as a user runs them: the password from stdin or a
prompt (asked twice), never on the command line nor in what is listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.acceptance.test_cli import Run, corral_env


def _with_input(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "users", *args],
        cwd=tmp_path,
        env=corral_env(),
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_users_are_added_listed_and_removed(corral: Run, tmp_path: Path) -> None:
    piped = _with_input(
        tmp_path, "correct horse\n", "add", "ada", "--tenant", "a", "--role", "operator",
        "--password-stdin",
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert "ada: operator of a" in piped.stdout
    prompted = _with_input(
        tmp_path, "battery staple\nbattery staple\n", "add", "root", "--all-tenants",
        "--role", "admin",
    )  # fmt: skip
    assert prompted.returncode == 0, prompted.stderr
    listed = json.loads(corral("users", "list", "--json").stdout)
    assert [(u["name"], u["tenant"], u["role"]) for u in listed] == [
        ("ada", "a", "operator"),
        ("root", None, "admin"),
    ]
    shown = corral("users", "list").stdout
    assert "ada" in shown
    assert "correct horse" not in shown
    assert "argon2" not in shown
    assert "removed" in corral("users", "remove", "ada").stdout
    assert [u["name"] for u in json.loads(corral("users", "list", "--json").stdout)] == ["root"]


def test_users_refuse_bad_input_naming_what_is_wrong(corral: Run, tmp_path: Path) -> None:
    neither = corral("users", "add", "bob", "--role", "viewer", check=False)
    assert neither.returncode == 2
    assert "--tenant T, or --all-tenants" in neither.stderr
    short = _with_input(
        tmp_path, "short\n", "add", "bob", "--tenant", "a", "--role", "viewer", "--password-stdin"
    )
    assert short.returncode == 2
    assert "password: must be at least 8 characters" in short.stderr
    gone = corral("users", "remove", "nobody", check=False)
    assert gone.returncode == 1
    assert "no user 'nobody'" in gone.stderr
