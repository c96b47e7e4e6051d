"""`corral users add | list | remove` as a user runs them: the password from stdin or a
prompt (asked twice), never on the command line nor in what is listed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Run, run_corral


def test_users_are_added_listed_and_removed(corral: Run, tmp_path: Path) -> None:
    piped = run_corral(
        tmp_path, "users", "add", "ada", "--tenant", "a", "--role", "operator",
        "--password-stdin", stdin="correct horse\n",
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert "ada: operator of a" in piped.stdout
    prompted = run_corral(
        tmp_path, "users", "add", "root", "--all-tenants", "--role", "admin",
        stdin="battery staple\nbattery staple\n",
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
    short = run_corral(
        tmp_path, "users", "add", "bob", "--tenant", "a", "--role", "viewer", "--password-stdin",
        stdin="short\n",
    )  # fmt: skip
    assert short.returncode == 2
    assert "password: must be at least 8 characters" in short.stderr
    gone = corral("users", "remove", "nobody", check=False)
    assert gone.returncode == 1
    assert "no user 'nobody'" in gone.stderr
