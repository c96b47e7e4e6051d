"""No secret of an HTTP job on any surface: one job carries a header and a query parameter
for every kind of name in redaction.SECRET_NAMES (and a password in its URL), is sent by a
real `corral serve --http` to a receiver on 127.0.0.1, and no secret value shows in the
API's JSON, `corral jobs show` (JSON and text), the run log (`corral jobs logs`) or the
serve log, which logs at DEBUG."""

from __future__ import annotations

import json
import signal
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from corral import redaction
from tests.acceptance.test_cli import serve_http
from tests.conftest import sqlite_copy
from tests.support.cli import run_corral
from tests.support.net import in_thread
from tests.support.wait import PATIENCE


def secret_names() -> list[str]:
    """A name of each kind the table covers: containing, being, ending with each entry."""
    table = redaction.SECRET_NAMES
    return [
        *(f"x-{part}-y" for part in table["contains"]),
        *table["is"],
        *(f"x{end}" for end in table["ends with"]),
    ]


def test_the_table_names_what_the_issue_lists() -> None:
    for name in ("X-Custom-Auth", "x-refresh-token", "X-Api-Key", "client_secret",
                 "x-signature-256", "sig", "password", "passwd", "pwd", "Authorization",
                 "Cookie"):  # fmt: skip
        assert redaction.names_a_secret(name), name
    for name in ("monkey", "signal", "page", "x-request-id", "content-type"):
        assert not redaction.names_a_secret(name), name


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def home(tmp_path: Path, sqlite_template: Path) -> Path:
    sqlite_copy(sqlite_template, tmp_path)
    (tmp_path / "corral.toml").write_text(
        'log_level = "DEBUG"\n[executors.http]\nallow_networks = ["127.0.0.0/8:1024-65535"]\n'
    )
    (tmp_path / "corral.toml").chmod(0o600)
    return tmp_path


def test_no_secret_shows_on_any_surface(home: Path) -> None:
    names = secret_names()
    values = {name: f"S3CR3T{n:03d}" for n, name in enumerate(names)}
    with in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Ok)) as receiver:
        port = receiver.server_address[1]
        query = "&".join(f"{name}={value}" for name, value in values.items())
        url = f"http://ada:S3CR3TPASS@127.0.0.1:{port}/hook?page=2&{query}"
        headers = [arg for name, v in values.items() for arg in ("--header", f"{name}: {v}")]
        submitted = run_corral(
            home, "submit", "--http", "POST", url, *headers, "--json", check=True
        )
        job_id = str(json.loads(submitted.stdout)["id"])
        admin = run_corral(
            home, "tokens", "create", "--all-tenants", "--role", "admin", "--json", check=True
        )
        token = json.loads(admin.stdout)["secret"]
        server, base = serve_http(home)
        try:
            shown = _until_succeeded(home, job_id)
            api = httpx.get(
                f"{base}/api/v1/jobs/{job_id}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=PATIENCE,
            ).text
        finally:
            server.send_signal(signal.SIGTERM)
            _, served_log = server.communicate(timeout=PATIENCE)
    surfaces = {
        "API JSON": api,
        "jobs show --json": shown,
        "jobs show": run_corral(home, "jobs", "show", job_id, check=True).stdout,
        "run log": run_corral(home, "jobs", "logs", job_id, check=True).stdout,
        "serve log": served_log,
    }
    assert "HTTP Request:" not in served_log  # the client's own line: corral's run log says it
    assert "page=2" in surfaces["jobs show --json"]
    for surface, text in surfaces.items():
        leaked = [name for name, v in values.items() if v in text]
        assert not leaked, f"{surface} shows the values of {leaked}"
        assert "S3CR3TPASS" not in text, f"{surface} shows the URL's password"


def _until_succeeded(home: Path, job_id: str) -> str:
    deadline = time.monotonic() + 2 * PATIENCE
    while time.monotonic() < deadline:
        said = run_corral(home, "jobs", "show", job_id, "--json", check=True).stdout
        if json.loads(said)["state"] in ("succeeded", "failed", "quarantined"):
            assert json.loads(said)["state"] == "succeeded", said
            return said
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end in time")
