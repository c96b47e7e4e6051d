"""The escalation a hostile tenant found, tried again on `corral serve --http` as a user
runs it: tenant b's operator token submits a process job that reads corral's settings
file and SQLite database, writes itself an all-tenant admin token there, and uses it.

Before tenants' jobs ran as strangers this made tenant b an admin of every tenant. Now
tenant b may be granted `process` only with `executors.process.uid_range` (or a
sandbox): its job runs under a uid of its own, and every step is refused."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_cli import serve_http, stopped
from tests.support.cli import corral_env, run_corral
from tests.support.wait import PATIENCE, eventually_sync

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uid_range needs corral as root")

SETTINGS = """\
attempt_key = "an-attempt-key-of-at-least-32-characters"

[tenants.b]
executors = ["process", "http"]

[executors.process]
uid_range = "190000-199999"
"""

JOB = textwrap.dedent(
    """
    import json, os, sqlite3, sys
    os.chdir(sys.argv[1])  # corral's folder, where a job of old started
    out = {}
    def attempt(what, do):
        try:
            do()
            out[what] = "allowed"
        except Exception as exc:
            out[what] = type(exc).__name__
    attempt("read corral.toml", lambda: open("corral.toml").read())
    attempt("read corral.db", lambda: open("corral.db", "rb").read(64))
    def admin():
        db = sqlite3.connect("corral.db")
        db.execute("update tokens set tenant = null, role = 'admin'")
        db.commit()
    attempt("make itself an admin", admin)
    def listing():
        found = set(os.listdir(".corral"))
        if found - {"runs", "attempt-api"}:  # a sandbox's stubs for its mounts are not
            return found
        raise PermissionError("only the sandbox's own mount points")
    attempt("list the state folder", listing)
    out["database url"] = "CORRAL_DATABASE_URL" in os.environ
    # Its one way to corral: the attempt API on the Unix socket, with its own token.
    import http.client, socket
    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(os.environ["CORRAL_API_URL"].removeprefix("unix:"))
    def call(method, path):
        conn = Unix("corral")
        token = os.environ["CORRAL_ATTEMPT_TOKEN"]
        conn.request(method, path, headers={"Authorization": "Bearer " + token})
        return conn.getresponse().status
    out["heartbeat"] = call("POST", "/api/v1/attempt/heartbeat")
    out["tokens over the socket"] = call("GET", "/api/v1/tokens")
    print(json.dumps(out))
    """
)


@pytest.fixture(params=["uid_range", "uid_range+bwrap"])
def home(request: pytest.FixtureRequest) -> Iterator[Path]:
    """corral's folder: under /tmp, which other users may pass through."""
    made = Path(tempfile.mkdtemp(prefix="corral-escalation-", dir="/tmp"))
    made.chmod(0o711)
    sandbox = 'sandbox = "bwrap"\n' if "bwrap" in request.param else ""
    (made / "corral.toml").write_text(SETTINGS + sandbox)
    (made / "corral.toml").chmod(0o600)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_a_tenants_process_job_cannot_make_its_tenant_an_admin(home: Path) -> None:
    run_corral(home, "db", "upgrade", check=True)
    made = run_corral(
        home, "tokens", "create", "--tenant", "b", "--role", "operator", "--json", check=True
    )
    secret = json.loads(made.stdout)["secret"]
    server, base = serve_http(home)
    try:
        api = httpx.Client(
            base_url=f"{base}/api/v1",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=PATIENCE,
        )
        job = {"spec": {"command": ["/usr/bin/python3", "-c", JOB, str(home)]}}
        submitted = api.post("/jobs", json=job)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        shown = eventually_sync(
            lambda: (
                (found := api.get(f"/jobs/{job_id}")).json()["state"] in ("succeeded", "failed")
                and found
            ),
            within=2 * PATIENCE,
            every=0.1,
            what=f"job {job_id} ended",
        )
        assert shown.json()["state"] == "succeeded", shown.text
        said = json.loads(
            (home / ".corral" / "runs" / f"corral-{job_id}-1" / "stdout.log").read_text()
        )
        refused = {"PermissionError", "FileNotFoundError"}  # a sandbox shows none of it
        for what in ("read corral.toml", "read corral.db", "list the state folder"):
            assert said.pop(what) in refused, what
        assert said == {
            "make itself an admin": "OperationalError",
            "database url": False,
            "heartbeat": 200,
            "tokens over the socket": 404,
        }
        # Still an operator of tenant b only: tenant a's jobs and the token list are closed.
        assert api.get("/tokens").status_code == 403
        api.close()
        tokens = json.loads(run_corral(home, "tokens", "list", "--json", check=True).stdout)
        # b's token, and the first admin token `serve --http` made for the operator.
        assert sorted((t["name"], t["tenant"] or "", t["role"]) for t in tokens) == [
            ("b operator", "b", "operator"),
            ("first admin", "", "admin"),
        ]
    finally:
        stopped(server)


def test_corral_will_not_serve_strangers_beside_a_settings_file_they_could_read(
    home: Path,
) -> None:
    (home / "corral.toml").chmod(0o644)
    said = run_corral(home, "serve", env=corral_env())
    assert said.returncode == 2, said
    told = " ".join(said.stderr.split())
    assert "the settings file corral.toml is readable by other users (mode 0644)" in told
    assert "chmod 600 corral.toml" in told
    assert "corral will not start until only it can read them" in told
