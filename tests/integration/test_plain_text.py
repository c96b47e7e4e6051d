"""Text a database cannot hold (a NUL, a lone surrogate) is refused at every edge, naming
the field, and nothing is stored; a value stored before corral refused them is still
shown, escaped. On both databases."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral import model, store
from corral.testing import FrozenClock
from tests.support.api import JOB, serving, sign_in
from tests.support.cli import run_corral

BAD = {"surrogate": "\ud800", "NUL": "\x00"}

FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("payload.note", {"payload": {"note": "{bad}"}}),
    ("payload.0", {"payload": ["{bad}"]}),
    ("labels.team", {"labels": {"team": "{bad}"}}),
    ("labels", {"labels": {"{bad}": "x"}}),
    ("idempotency_key", {"idempotency_key": "k{bad}"}),
    ("spec.what", {"spec": {"what": "{bad}"}}),
]


def _raw(body: Any, bad: str) -> bytes:
    """`body` as JSON text, with `bad` where it says {bad}, escaped as JSON escapes it."""
    text = json.dumps(body)
    return text.replace("{bad}", json.dumps(bad)[1:-1]).encode("ascii")


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize(("field", "given"), FIELDS, ids=[f for f, _ in FIELDS])
async def test_a_job_with_text_no_database_holds_is_refused_naming_the_field(
    db: store.Store, kind: str, field: str, given: dict[str, Any]
) -> None:
    async with serving(db, [("op", "a", "operator")]) as api:
        body = {**JOB, **given}
        for sent in (body, [JOB, body]):
            answer = await api.http.post(
                "/api/v1/jobs",
                content=_raw(sent, BAD[kind]),
                headers={**api.as_("op"), "Content-Type": "application/json"},
            )
            assert answer.status_code == 422, answer.text
            named = field if isinstance(sent, dict) else f"1.{field}"
            assert answer.json()["field"] == named, answer.json()
            assert kind.lower() in answer.json()["error"].lower() or "NUL" in answer.text
        assert await db.jobs.list(model.JobFilter(states=[]), limit=10) == []


async def test_a_token_name_with_a_lone_surrogate_is_refused(db: store.Store) -> None:
    async with serving(db, [("admin", None, "admin")]) as api:
        answer = await api.http.post(
            "/api/v1/tokens",
            content=b'{"name": "x\\ud800", "tenant": "a", "role": "viewer"}',
            headers={**api.as_("admin"), "Content-Type": "application/json"},
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == "name"
        assert [t.name for t in await api.c.store.tokens.list()] == ["admin"]


async def test_malformed_json_is_the_body_s_fault_with_where_it_broke(db: store.Store) -> None:
    async with serving(db, [("op", "a", "operator")]) as api:
        answer = await api.http.post(
            "/api/v1/jobs",
            content=b'{"spec": {}, "executor": ',
            headers={**api.as_("op"), "Content-Type": "application/json"},
        )
        assert answer.status_code == 422
        said = answer.json()
        assert said["field"] == "body"
        assert said["error"].startswith("body: not valid JSON:")
        assert "at character" in said["error"]


async def test_a_surrogate_stored_before_is_shown_escaped_never_a_500(
    db: store.Store,
) -> None:
    if db.database.dialect != "sqlite":
        pytest.skip("PostgreSQL never stored one: its JSONB refuses \\ud800")
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, tenant="a", payload={"n": "x\ud800"})],
        now=FrozenClock().now(),
    )
    async with serving(db, [("admin", None, "admin")]) as api:
        await api.c.user_add("ada", password="correct horse", tenant=None, role="admin")
        shown = await api.http.get(f"/api/v1/jobs/{job_id}", headers=api.as_("admin"))
        assert shown.status_code == 200
        assert "\\ud800" in shown.text
        listed = await api.http.get("/api/v1/jobs", headers=api.as_("admin"))
        assert listed.status_code == 200
        await sign_in(api.http, name="ada", password="correct horse")
        for page in (f"/ui/jobs/{job_id}", "/ui/jobs"):
            answer = await api.http.get(page)
            assert answer.status_code == 200, page


def test_the_cli_refuses_bytes_that_are_not_text(tmp_path: Path) -> None:
    """The shell hands undecodable bytes over as they are: Python reads them as lone
    surrogates, which `corral submit` refuses (exit 2) naming the field."""
    not_text = os.fsdecode(b"\xff")
    run_corral(tmp_path, "db", "upgrade", check=True)
    payload = '{"note": "' + not_text + '"}'
    said = run_corral(tmp_path, "submit", "--payload", payload, "--", "true")
    assert said.returncode == 2, said
    assert "payload.note: must not hold a lone surrogate" in said.stderr
    listed = run_corral(tmp_path, "jobs", "list", "--json", check=True)
    assert json.loads(listed.stdout) == []
