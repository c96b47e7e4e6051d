"""`corral monitors` as the operator runs it, in a subprocess on a real SQLite file: refused
while public_url is unset, made with its ping URL alone on the last line, listed and shown
(`--json`), pinged at that URL through a real `corral serve --http`, paused, resumed,
rotated and deleted; and `corral check` warns of a public_url that monitors need."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.acceptance.test_cli import serve_http, stopped
from tests.support.cli import Run
from tests.support.wait import eventually_sync


def test_the_operator_makes_pings_and_manages_a_monitor(corral: Run, tmp_path: Path) -> None:
    add = ("monitors", "add", "backup", "--period", "1h", "--grace", "5m")
    refused = corral(*add, check=False)
    assert refused.returncode == 2  # a usage error: the settings lack public_url
    assert "public_url" in refused.stderr
    settings = tmp_path / "corral.toml"
    settings.write_text('public_url = "https://corral.example.com"\n')
    made = corral(*add).stdout.strip().splitlines()
    url = made[-1]
    assert url.startswith("https://corral.example.com/ping/")
    assert " " not in url
    listed = json.loads(corral("monitors", "list", "--json").stdout)
    assert [(m["name"], m["state"], m["ping_url"]) for m in listed] == [("backup", "up", url)]
    assert "backup" in corral("monitors", "list").stdout

    proc, base = serve_http(tmp_path)
    try:
        path = url.removeprefix("https://corral.example.com")
        answered = httpx.post(f"{base}{path}/fail", content=b"disk full", timeout=30)
        assert answered.json() == {"ok": True, "state": "failed"}

        def shown() -> dict[str, object] | None:
            found = json.loads(corral("monitors", "show", "backup", "--json").stdout)
            return found if found["state"] == "failed" else None

        found = eventually_sync(shown)
        assert [(p["kind"], p["body"]) for p in found["pings"]] == [("fail", "disk full")]  # type: ignore[index]
    finally:
        stopped(proc)
    page = corral("monitors", "show", "backup").stdout
    assert "disk full" in page
    pinged = found["pings"][0]["at"]  # type: ignore[index]
    assert pinged[:19].replace("T", " ") in page  # to the second, as a person reads it
    assert pinged not in page

    corral("monitors", "pause", "backup")
    assert json.loads(corral("monitors", "show", "backup", "--json").stdout)["state"] == "paused"
    corral("monitors", "resume", "backup")
    new = corral("monitors", "rotate", "backup").stdout.strip().splitlines()[-1]
    assert new != url
    assert new.startswith("https://corral.example.com/ping/")

    settings.write_text("")
    warned = corral("check").stderr
    assert "public_url is not set while monitors or alert rules exist" in warned
    corral("monitors", "delete", "backup")
    assert json.loads(corral("monitors", "list", "--json").stdout) == []
    missing = corral("monitors", "show", "backup", check=False)
    assert missing.returncode == 1
    assert "no monitor 'backup'" in missing.stderr
