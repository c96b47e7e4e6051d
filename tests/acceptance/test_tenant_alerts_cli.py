"""`corral alerts channels | rules` as the operator runs them for a tenant, in a
subprocess on a real SQLite file, with a real receiver on 127.0.0.1: made, listed (never a
webhook's URL whole), tested, muted by their outbox name, and deleted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.acceptance.test_cli import serve, stopped
from tests.support.cli import Run, corral_env, run_corral
from tests.support.wait import eventually_sync


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_operator_makes_lists_tests_and_deletes_a_tenant_s_channels_and_rules(
    corral: Run, tmp_path: Path, receiver: tuple[str, list[str]]
) -> None:
    base, seen = receiver
    port = base.rsplit(":", 1)[1]
    (tmp_path / "corral.toml").write_text(
        f'[executors.http]\nallow_networks = ["127.0.0.1:{port}"]\n'
    )
    url = f"{base}/services/T0/B0/sekret"
    corral(
        "alerts", "channels", "add", "oncall", "--tenant", "acme", "--kind", "slack", "--url", url
    )
    listed = corral("alerts", "channels", "list", "--tenant", "acme", "--json").stdout
    assert "sekret" not in listed
    assert [c["name"] for c in json.loads(listed)] == ["oncall"]
    assert "sekret" not in corral("alerts", "channels", "list", "--tenant", "acme").stdout
    assert (
        json.loads(corral("alerts", "channels", "list", "--tenant", "beta", "--json").stdout) == []
    )
    said = corral("alerts", "channels", "test", "oncall", "--tenant", "acme").stdout
    assert "test message delivered through oncall of tenant acme" in said
    assert seen == ["/services/T0/B0/sekret"]
    elsewhere = corral("alerts", "channels", "test", "oncall", "--tenant", "beta", check=False)
    assert elsewhere.returncode == 1
    assert "no alert channel 'oncall'" in elsewhere.stderr
    corral(
        "alerts",
        "rules",
        "add",
        "broken",
        "--tenant",
        "acme",
        "--on",
        "quarantined",
        "--channel",
        "oncall",
        "--schedule",
        "nightly",
    )
    rules = json.loads(corral("alerts", "rules", "list", "--tenant", "acme", "--json").stdout)
    assert [(r["alerts_as"], r["match"]) for r in rules] == [
        ("tenant:acme/broken", {"schedule": "nightly"})
    ]
    every = corral("alerts", "list", "--json").stdout
    assert "sekret" not in every
    listed_all = json.loads(every)
    assert [r["alerts_as"] for r in listed_all["tenant_rules"]] == ["tenant:acme/broken"]
    assert [(ch["tenant"], ch["name"]) for ch in listed_all["tenant_channels"]] == [
        ("acme", "oncall")
    ]
    table = corral("alerts", "list").stdout
    assert "tenant:acme/broken" in table
    assert "tenant:acme/oncall" in table
    tested = corral("alerts", "test", "tenant:acme/oncall").stdout
    assert "test message delivered through tenant:acme/oncall" in tested
    assert len(seen) == 2
    muted = corral("alerts", "mute", "tenant:acme/broken", "--for", "1h").stdout
    assert "rule tenant:acme/broken muted" in muted
    corral("alerts", "unmute", "tenant:acme/broken")
    private = corral(
        "alerts",
        "channels",
        "add",
        "x",
        "--tenant",
        "acme",
        "--kind",
        "slack",
        "--url",
        "http://10.1.2.3/hook",
        check=False,
    )
    assert private.returncode == 2  # bad input
    assert "webhook_url" in private.stderr
    mail = corral(
        "alerts",
        "channels",
        "add",
        "m",
        "--tenant",
        "acme",
        "--kind",
        "email",
        "--to",
        "a@example.com",
        check=False,
    )
    assert "alerts.tenant_smtp.url" in mail.stderr
    corral("alerts", "rules", "delete", "broken", "--tenant", "acme")
    corral("alerts", "channels", "delete", "oncall", "--tenant", "acme")
    assert (
        json.loads(corral("alerts", "channels", "list", "--tenant", "acme", "--json").stdout) == []
    )


QUARANTINE_AT_3 = {
    "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}]
}


def test_serve_sends_a_tenant_s_alert_with_no_rule_in_the_settings(
    corral: Run, tmp_path: Path, receiver: tuple[str, list[str]]
) -> None:
    """`corral serve` runs its alerter though the settings name no rule: a tenant's own
    rule, made with the CLI, sends its quarantine to its own channel."""
    base, seen = receiver
    port = base.rsplit(":", 1)[1]
    (tmp_path / "corral.toml").write_text(
        f'[executors.http]\nallow_networks = ["127.0.0.1:{port}"]\n'
    )
    corral("alerts", "channels", "add", "oncall", "--tenant", "acme", "--kind", "slack",
           "--url", f"{base}/hooks/acme")  # fmt: skip
    corral("alerts", "rules", "add", "broken", "--tenant", "acme", "--on", "quarantined",
           "--channel", "oncall")  # fmt: skip
    server = serve(tmp_path)
    try:
        eventually_sync(
            lambda: "alerter" in corral("status").stdout, what="serve's alerter recorded"
        )
        job = {"spec": {"command": ["sh", "-c", "exit 3"]}, "tenant": "acme",
               "policy": QUARANTINE_AT_3}  # fmt: skip
        run_corral(tmp_path, "submit", "--from-file", "-", stdin=json.dumps(job) + "\n",
                   env=corral_env(), check=True)  # fmt: skip
        eventually_sync(lambda: seen == ["/hooks/acme"], what="the tenant's Slack message")
    finally:
        stopped(server)
