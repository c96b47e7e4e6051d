"""corral.documents, pure: YAML and TOML read into documents (YAML 1.2's booleans, so a
rule's `on` is a key; dates as ISO text), refusals naming the file and the document, the
fields that differ as paths; a plan's lines and summary, saying what it takes over; and a
placeholder (`kept`) that redaction.left finds where no stored value stood behind it."""

from __future__ import annotations

import pytest

from corral import documents, errors, redaction


def test_yaml_and_toml_documents_are_read_in_order() -> None:
    text = "kind: AlertRule\nname: r\non: [failed]\n---\n---\n- {kind: Schedule, name: a, start: 2026-01-01}\n"
    found = documents.parse(text, "x.yaml")
    assert [(d.kind, d.name, d.index) for d in found] == [
        ("AlertRule", "r", 1),
        ("Schedule", "a", 2),
    ]
    assert found[0].fields == {"on": ["failed"]}
    assert found[1].fields == {"start": "2026-01-01"}
    toml = '[[document]]\nkind = "Monitor"\nname = "m"\ntenant = "t"\nperiod = "1h"\n'
    [monitor] = documents.parse(toml, "m.toml")
    assert (monitor.tenant, monitor.fields, monitor.where) == (
        "t",
        {"period": "1h"},
        "m.toml: document 1 (Monitor 'm')",
    )


@pytest.mark.parametrize(
    ("text", "source", "said"),
    [
        ("kind: [", "a.yaml", "a.yaml: not YAML at line 1"),
        ("name: x\n", "a.yaml", "a.yaml: document 1: kind: required"),
        ("kind: Schedule\n---\n- 3\n", "a.yaml", "a.yaml: document 1 (Schedule): name: required"),
        ('name = "x"\n', "a.toml", "a.toml: a TOML file holds one document"),
        ("- 3\n", "a.yaml", "a.yaml: document 1: must be a mapping"),
    ],
)
def test_what_is_no_document_is_refused_naming_where(text: str, source: str, said: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        documents.parse(text, source)
    assert str(refused.value).startswith(said)


def test_twins_changed_fields_and_the_written_form() -> None:
    given = documents.parse("kind: Schedule\nname: a\n---\nkind: Schedule\nname: a\n", "x.yaml")
    with pytest.raises(
        errors.InvalidInput, match=r"document 2 .*given twice \(first in x.yaml, document 1\)"
    ):
        documents.twins(given)
    wanted = {"cron": "1 * * * *", "spec": {"command": ["a"], "env": {"A": "1"}}, "tz": "UTC"}
    held = {"cron": "1 * * * *", "spec": {"command": ("b",), "env": {"A": "1"}}, "jitter": "5s"}
    assert documents.changed(wanted, held) == ["jitter", "spec.command", "tz"]
    assert documents.changed(wanted, dict(wanted)) == []
    written = documents.dumped([{"kind": "AlertRule", "name": "r", "on": ["failed"]}])
    assert [(d.kind, d.fields) for d in documents.parse(written, "-")] == [
        ("AlertRule", {"on": ["failed"]})
    ]


def test_a_placeholder_is_restored_where_a_secret_was_and_found_where_none_was() -> None:
    stored = {"url": "https://u:pw@h/x?token=t1&a=1", "headers": {"Authorization": "Bearer z"}}
    shown = redaction.redacted(stored, documents.KEPT)
    assert shown == {"url": "https://kept@h/x?token=kept&a=1", "headers": {"Authorization": "kept"}}
    assert redaction.restored(shown, stored, documents.KEPT) == stored
    assert redaction.left(redaction.restored(shown, stored, documents.KEPT), documents.KEPT) is None
    assert redaction.left(shown, documents.KEPT) == "url"
    assert (
        redaction.left({"headers": {"Authorization": "kept"}}, documents.KEPT)
        == "headers.Authorization"
    )
    assert redaction.left({"url": "https://h/kept?a=kept"}, documents.KEPT) is None  # not secrets


def test_a_plan_says_what_it_takes_over() -> None:
    A = documents.Action
    steps = [
        documents.Step(A.CREATE, "Flow", "stripe"),
        documents.Step(A.CHANGE, "Schedule", "sync", ("cron",), adopted=True),
        documents.Step(A.UNCHANGED, "Monitor", "backup", adopted=True),
        documents.Step(A.UNCHANGED, "AlertRule", "broken"),
    ]
    assert documents.plan_lines(steps) == [
        "+ Flow stripe",
        "~ Schedule sync: cron (taken over)",
        "= Monitor backup (taken over)",
        "= AlertRule broken",
    ]
    assert documents.summary(steps) == (
        "1 to create, 1 to change, 0 to delete, 2 unchanged; 2 made by hand taken over"
    )
    assert [s["adopted"] for s in documents.plan_dict("t", steps, dry_run=True)["steps"]] == [
        False, True, True, False,
    ]  # fmt: skip
    assert [s.writes for s in steps] == [True, True, True, False]
