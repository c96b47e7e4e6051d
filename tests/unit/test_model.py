"""The pure model: transition tables, launch names and self-describing labels."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import errors, launching, model

DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    ("entity", "frm", "to"),
    [
        ("job", "queued", "running"),
        ("job", "running", "queued"),
        ("attempt", "launching", "running"),
        ("attempt", "running", "lost"),
        ("attempt", "launching", "succeeded"),
    ],
)
def test_allowed_transitions_pass(entity: model.Entity, frm: str, to: str) -> None:
    model.check_transition(entity, frm, to)


@pytest.mark.parametrize(
    ("entity", "frm", "to"),
    [
        ("job", "succeeded", "running"),
        ("job", "queued", "succeeded"),
        ("attempt", "failed", "running"),
        ("attempt", "succeeded", "failed"),
    ],
)
def test_illegal_transitions_name_both_states(entity: model.Entity, frm: str, to: str) -> None:
    with pytest.raises(errors.IllegalTransition, match=f"'{frm}' to '{to}'"):
        model.check_transition(entity, frm, to)


def test_unknown_state_is_illegal() -> None:
    with pytest.raises(errors.IllegalTransition, match="bogus"):
        model.check_transition("job", "bogus", "queued")


def test_final_states_have_no_way_out() -> None:
    assert model.FINAL_JOB_STATES == {"succeeded", "failed", "cancelled"}
    assert model.FINAL_ATTEMPT_STATES == {"succeeded", "failed", "lost", "cancelled", "superseded"}


def test_launch_name_is_plain_for_numeric_ids() -> None:
    assert model.launch_name(42, 3) == "corral-42-3"


@given(
    job_id=st.one_of(st.integers(min_value=0, max_value=2**63), st.text(min_size=1, max_size=300)),
    attempt_no=st.integers(min_value=1, max_value=10**6),
)
def test_launch_name_is_dns_safe_and_short_for_any_id(job_id: int | str, attempt_no: int) -> None:
    name = model.launch_name(job_id, attempt_no)
    assert len(name) <= 63
    assert DNS_1123.match(name), name
    assert name.endswith(f"-{attempt_no}")
    assert model.launch_name(job_id, attempt_no) == name
    if isinstance(job_id, int):  # a store's id takes a short cut: it must agree with the text
        assert model.launch_name(str(job_id), attempt_no) == name


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_distinct_unsafe_ids_get_distinct_names(a: str, b: str) -> None:
    if a != b:
        assert model.launch_name(a, 1) != model.launch_name(b, 1)


def test_identity_round_trips_through_labels() -> None:
    labels = model.identity_labels(
        job_id=7, attempt_no=2, fence=99, tenant="acme", capability="etl", idempotency_key="x" * 200
    )
    assert model.identity_from_labels(labels) == model.Identity(7, 2, 99)
    assert len(labels[model.IDEMPOTENCY_KEY]) <= 63
    assert model.identity_from_labels({"app": "other"}) is None
    assert model.identity_from_labels({**labels, model.FENCE: "nope"}) is None


@pytest.mark.parametrize(
    ("key", "value"), [("team", "data"), ("example.com/team", "a-b.c_d"), ("x", "")]
)
def test_valid_labels(key: str, value: str) -> None:
    model.check_label(key, value)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("-bad", "v", "label key"),
        ("team", "has space", "value"),
        ("team", "x" * 64, "value"),
        ("corral.dev/job-id", "1", "reserved"),
        ("UPPER.com/x", "v", "label key"),
    ],
)
def test_invalid_labels_are_refused_with_the_rule(key: str, value: str, why: str) -> None:
    with pytest.raises(errors.InvalidInput, match=why):
        model.check_label(key, value)


# --- payloads ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


def test_a_payload_is_compact_json_with_its_characters_as_they_are() -> None:
    assert (
        launching.payload_json({"city": "Zürich", "days": [1, 2]})
        == '{"city":"Zürich","days":[1,2]}'
    )
    assert launching.payload_json("🐎") == '"🐎"'
    assert launching.payload_json(0) == "0"
    assert launching.payload_json(None) is None, "no payload: nothing to deliver"


def test_a_payload_with_a_lone_surrogate_keeps_its_escape() -> None:
    # A JSON "\ud800" reads as a string with no UTF-8 form: the escape is kept instead.
    assert launching.payload_json(json.loads('["\\ud800", "é"]')) == '["\\ud800","\\u00e9"]'


@given(json_values)
def test_every_payload_reads_back_as_itself(payload: object) -> None:
    text = launching.payload_json(payload)
    assert (text is None) == (payload is None)
    if text is not None:
        assert json.loads(text.encode("utf-8")) == payload
