"""Assertions on an HTTP response: the JSONPath subset and its operators, the spec's checks
at submit, judging a response, and how a failed assertion is classed and decided."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import errors, launching, model, retry
from corral.executors import http_assertions, http_outcome, http_spec
from corral.policy import JobPolicy

FC = model.FailureClass
URL = "https://example.com/health"


def spec(**more: Any) -> dict[str, Any]:
    return http_spec.check_spec({"url": URL, **more})


def response(body: Any, *, seconds: float = 0.01, cut: bool = False, **kw: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http_assertions.Response(raw, cut, seconds, **kw)


# --- the JSONPath subset --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "op", "value"),
    [
        ("$.ok == true", ("ok",), "==", True),
        ("$.a.b[0] >= 3", ("a", "b", 0), ">=", 3),
        ('$["a b"][-1] exists', ("a b", -1), "exists", None),
        ("$ != null", (), "!=", None),
        ('$.x=="y"', ("x",), "==", "y"),
        ('  $.items[2].name   <   "m"  ', ("items", 2, "name"), "<", "m"),
        ('$.a == {"b": [1, 2]}', ("a",), "==", {"b": [1, 2]}),
        ("$.kebab-case_key <= 1.5", ("kebab-case_key",), "<=", 1.5),
    ],
)
def test_an_assertion_is_read_as_path_operator_and_value(
    text: str, path: tuple[Any, ...], op: str, value: Any
) -> None:
    parsed = http_assertions.parse(text)
    assert (parsed.path, parsed.op, parsed.value) == (path, op, value)
    assert http_assertions.parse(parsed.text) == parsed  # the normal form reads back


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("ok == 1", "a path starts with $"),
        ("$.ok = true", "an operator: one of ==, !=, <=, >=, <, >, exists"),
        ("$.ok", "an operator"),
        ("$.ok ~= 1", "an operator"),
        ("$..a == 1", "after . a name"),
        ("$.a[01] == 1", "] expected"),
        ("$.a[x] == 1", "an index [0] or a key"),
        ('$["a] == 1', "a key in brackets is a JSON string"),
        ("$.a ==", "== needs a value"),
        ("$.a exists 1", "exists takes no value"),
        ("$.a == 'x'", "is not a JSON literal"),
        ("$.a == yes", "is not a JSON literal"),
        ("$.a == NaN", "is not a JSON literal"),
        ("$.a < true", "< compares numbers or strings, not true"),
        ("$.a > [1]", "> compares numbers or strings"),
        ("$" + ".a" * 33 + " exists", "at most 32 steps"),
        ("$.a == " + '"' + "x" * 1000 + '"', "at most 1,000 characters"),
    ],
)
def test_a_malformed_assertion_is_refused_saying_the_rule(text: str, rule: str) -> None:
    with pytest.raises(ValueError, match=re.escape(rule)):
        http_assertions.parse(text)


_KEYS = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True),
    st.text(max_size=8),
)
_STEPS = st.lists(st.one_of(_KEYS, st.integers(-50, 50)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(_STEPS)
def test_every_path_written_reads_back_as_itself(steps: list[str | int]) -> None:
    text = http_assertions.path_text(steps)
    assert http_assertions.parse_path(text) == (tuple(steps), len(text))
    assert http_assertions.parse(f"{text} exists").path == tuple(steps)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_read_or_refused_with_a_value_error(text: str) -> None:
    try:
        parsed = http_assertions.parse(text)
    except ValueError:
        return
    assert http_assertions.parse(parsed.text) == parsed


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(_JSON, st.data())
def test_what_a_path_into_a_document_finds_equals_itself(document: Any, data: Any) -> None:
    path: list[str | int] = []
    here = document
    while isinstance(here, list | dict) and here and data.draw(st.booleans()):
        step = data.draw(
            st.sampled_from(list(range(len(here))) if isinstance(here, list) else list(here))
        )
        path.append(step)
        here = here[step]
    found, value = http_assertions.lookup(document, path)
    assert found
    assertion = http_assertions.JsonAssertion(tuple(path), "==", value)
    assert http_assertions.holds(assertion, found, value)
    literal = json.dumps(value, allow_nan=False)
    assert http_assertions.parse(f"{http_assertions.path_text(path)} == {literal}").path == tuple(
        path
    )


@pytest.mark.parametrize(
    ("document", "text", "holds"),
    [
        ({"ok": True}, "$.ok == true", True),
        ({"ok": False}, "$.ok == true", False),
        ({"ok": 1}, "$.ok == true", False),  # a boolean is never a number
        ({"n": 1.0}, "$.n == 1", True),
        ({"n": 3}, "$.n > 2", True),
        ({"n": "3"}, "$.n > 2", False),  # a string is not ordered against a number
        ({"v": "b"}, '$.v >= "a"', True),
        ({"items": [1, 2, 3]}, "$.items[-1] == 3", True),
        ({"items": []}, "$.items[0] exists", False),
        ({"a": None}, "$.a exists", True),
        ({"a": None}, "$.a == null", True),
        ({}, "$.a != 1", False),  # nothing there holds nothing but a failed exists
        ({"a": {"b": [1, {"c": "d"}]}}, '$.a == {"b": [1, {"c": "d"}]}', True),
        ({"a": [1, 2]}, "$.a != [2, 1]", True),
    ],
)
def test_operators_compare_json_values(document: Any, text: str, holds: bool) -> None:
    assertion = http_assertions.parse(text)
    found, value = http_assertions.lookup(document, assertion.path)
    assert http_assertions.holds(assertion, found, value) is holds


# --- the spec, at submit ------------------------------------------------------------------


def test_a_spec_s_assertions_are_normalised_and_others_left_out() -> None:
    assert "expect_json" not in spec()
    made = spec(expect_body="ok", expect_json="$.ok==true", max_response_time=2)
    assert made["expect_json"] == ["$.ok == true"]
    assert (made["expect_body"], made["max_response_time"]) == ("ok", "2s")
    assert spec(max_response_time="1500ms")["max_response_time"] == "1.5s"
    assert "expect_json" not in spec(expect_json=[])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("expect_body", "", "http spec: expect_body: must be a regular expression"),
        ("expect_body", 3, "http spec: expect_body: must be a regular expression"),
        ("expect_body", r"(a)\1", "http spec: expect_body: invalid escape sequence"),
        ("expect_body", "(?=a)", "no backreferences or lookaround"),
        ("expect_body", "(", "http spec: expect_body: missing )"),
        ("expect_body", "x" * 1001, "a pattern has at most 1,000"),
        ("expect_body", "((((a{100}){100}){100}){100})", "http spec: expect_body:"),
        (
            "expect_body",
            r"\pL{239}x",
            "http spec: expect_body: compiles to an RE2 program of 285,849 instructions;"
            " at most 10,000",
        ),
        (
            "expect_json",
            "$.n < 1e999",
            "http spec: expect_json: '$.n < 1e999': 1e999 is not a finite number",
        ),
        ("expect_json", "$.n == [1, -1e400]", "-1e400 is not a finite number"),
        ("expect_json", 1, "http spec: expect_json: must be an assertion 'PATH OP VALUE'"),
        ("expect_json", ["$.a exists", 2], "must be an assertion"),
        ("expect_json", "$.ok = true", "http spec: expect_json: '$.ok = true': after the path"),
        ("expect_json", ["$.a exists"] * 21, "21 assertions; at most 20"),
        ("max_response_time", "2 sec", "http spec: max_response_time: '2 sec' is not a duration"),
        ("max_response_time", 0, "between 1ms and 365 days"),
        ("max_response_time", True, "is not a duration"),
    ],
)
def test_a_bad_assertion_is_refused_at_submit_naming_the_field(
    field: str, value: Any, message: str
) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        spec(**{field: value})
    assert message in str(caught.value)


def test_a_pattern_that_backtracks_for_ever_in_python_is_matched_in_linear_time() -> None:
    """`(a+)+$` against a's and a '!' takes Python's re exponential time; RE2's is linear,
    so a stranger's pattern cannot hold the dispatcher's loop. A bound far from what a
    loaded machine takes: a second for 64 KiB, where Python's re would not finish."""
    made = spec(expect_body="(a+)+$")
    body = b"a" * 65_535 + b"!"
    began = time.perf_counter()
    [check] = http_assertions.judge(made, response(body))
    assert time.perf_counter() - began < 1.0
    assert not check.ok


def test_the_program_size_bound_takes_a_long_class_repeated() -> None:
    """`[^x]{999}` (7,996 instructions) is within MAX_PROGRAM_SIZE; `\\pL{239}x`, which
    held the event loop ~0.4 s on 64 KiB of ASCII, is refused (above)."""
    assert spec(expect_body="[^x]{999}")["expect_body"] == "[^x]{999}"
    assert http_assertions.compiled("[^x]{999}").programsize <= http_assertions.MAX_PROGRAM_SIZE


def test_a_numbers_written_back_form_parses_again() -> None:
    """What the spec keeps is read again at each attempt: a number written back must parse."""
    for text in ("$.n < 1e308", "$.n == -0.5e-300", "$.n >= 12345678901234567890"):
        kept = http_assertions.parse(text).text
        assert http_assertions.parse(kept).text == kept


# --- judged on a response -----------------------------------------------------------------


def test_each_assertion_is_judged_in_order_with_what_was_seen() -> None:
    made = spec(
        max_response_time="100ms",
        expect_body='"ok": *true',
        expect_json=["$.ok == true", "$.n > 2", "$.missing exists"],
    )
    checks = http_assertions.judge(made, response({"ok": False, "n": 3}, seconds=0.25))
    assert [(c.name, c.ok, c.seen) for c in checks] == [
        ("max_response_time 100ms", False, "took 250 ms"),
        ('expect_body /"ok": *true/', False, 'not in the body, which begins {"ok": false, "n": 3}'),
        ("expect_json $.ok == true", False, "saw false"),
        ("expect_json $.n > 2", True, "saw 3"),
        ("expect_json $.missing exists", False, "nothing at $.missing"),
    ]


@pytest.mark.parametrize(
    ("body", "kw", "seen"),
    [
        (b"<html>oops</html>", {}, "the body is not JSON (Expecting value: line 1 column 1"),
        (b'{"ok": tr', {"cut": True}, "the body goes on past the 9 bytes read"),
        (b"\x1f\x8b", {"encoding": "gzip"}, "the body came gzip-encoded"),
        (b"[" * 100_000, {}, "the body is not JSON"),
    ],
)
def test_a_body_that_cannot_be_read_as_json_fails_saying_why(
    body: bytes, kw: dict[str, Any], seen: str
) -> None:
    [check] = http_assertions.judge(spec(expect_json="$.ok == true"), response(body, **kw))
    assert not check.ok
    assert check.seen.startswith(seen)


def test_a_nul_of_a_body_is_quoted_as_a_replacement_character() -> None:
    """What a failed check quotes goes into the attempt's reason and message, which
    PostgreSQL's text columns hold only without a NUL."""
    made = spec(expect_body="ok")
    outcome = http_outcome.Outcome(200, "OK", "203.0.113.7", 0.01, b"\x00\x01 binary")
    judged = http_outcome.verdict(outcome, made)
    assert "\x00" not in judged.reason
    assert "which begins \ufffd\x01 binary" in judged.reason
    not_json = http_outcome.verdict(outcome, spec(expect_json="$.ok == true"))
    assert "\x00" not in not_json.reason
    failed = http_outcome.verdict(
        http_outcome.Outcome(500, "", "203.0.113.7", 0.01, b"\x00x"), made
    )
    assert failed.message == "\ufffdx"


def test_a_long_value_seen_is_quoted_in_part() -> None:
    [check] = http_assertions.judge(spec(expect_json="$.s == 1"), response({"s": "x" * 500}))
    assert check.seen == 'saw "' + "x" * 199 + "..."


def _outcome(status: int, body: Any, seconds: float = 0.01) -> http_outcome.Outcome:
    return http_outcome.Outcome(
        status, "OK", "203.0.113.7", seconds, json.dumps(body).encode(), headers=()
    )


def test_a_success_that_fails_an_assertion_is_a_failure_of_class_assertion() -> None:
    made = spec(expect_json=["$.ok == true", "$.n == 1"])
    judged = http_outcome.verdict(_outcome(200, {"ok": False, "n": 2}), made)
    assert (judged.phase, judged.failure) == (launching.Phase.FAILED, FC.ASSERTION)
    said = "assertion failed: expect_json $.ok == true (saw false); and 1 more"
    assert judged.message == said
    assert judged.reason.startswith(f"{said}; HTTP 200 OK in 10 ms (203.0.113.7)")
    log = http_outcome.run_log(None, _outcome(200, {}), judged.checks)
    assert log.stream("assertions") == launching.Stream(
        "assertions",
        "FAILED  expect_json $.ok == true: saw false\nFAILED  expect_json $.n == 1: saw 2\n",
        80,
    )


def test_assertions_judge_only_a_status_that_succeeded() -> None:
    made = spec(expect_json="$.ok == true")
    failed = http_outcome.verdict(_outcome(503, {"ok": False}), made)
    assert (failed.failure, failed.checks) == (FC.TRANSIENT, ())
    passed = http_outcome.verdict(_outcome(200, {"ok": True}), made)
    assert (passed.phase, passed.failure, passed.message) == (launching.Phase.SUCCEEDED, None, None)
    assert [c.ok for c in passed.checks] == [True]
    plain = http_outcome.verdict(_outcome(200, {"ok": False}), spec())
    assert (plain.phase, plain.checks) == (launching.Phase.SUCCEEDED, ())


# --- classed and decided -------------------------------------------------------------------


def classify(
    rules: list[dict[str, Any]], hint: FC | None, status: int | None = 200
) -> retry.Failure:
    return retry.classify(
        JobPolicy.model_validate({"failure_rules": rules}),
        executor="http",
        state=model.AttemptState.FAILED,
        exit_code=None,
        reason="assertion failed: expect_json $.ok == true (saw false); HTTP 200 OK",
        hint=hint,
        message=None,
        http_status=status,
    )


def test_a_failed_assertion_quarantines_unless_a_class_rule_says_otherwise() -> None:
    plain = classify([], FC.ASSERTION)
    assert plain.cls == FC.ASSERTION
    decided = retry.decide(
        plain,
        state=model.AttemptState.FAILED,
        attempt_no=1,
        charged=1,
        max_attempts=5,
        streak=1,
        quarantine_after=2,
        delay=1.0,
    )
    assert decided.to == model.JobState.QUARANTINED
    assert decided.reason.startswith("quarantined: attempt 1 failed permanently (http executor:")
    ruled = classify([{"on_failure_classes": ["assertion"], "action": "retry"}], FC.ASSERTION)
    assert (ruled.cls, ruled.counts) == (FC.TRANSIENT, True)
    assert ruled.why == "rule 1: failure class assertion In [assertion] -> retry"


def test_class_rules_and_status_rules_take_turns_and_a_status_rule_skips_an_assertion() -> None:
    any_200 = {"on_http_statuses": {"operator": "NotIn", "values": [404]}, "action": "ignore"}
    transient = {"on_failure_classes": ["transient"], "action": "fail"}
    assertion = {"on_failure_classes": ["assertion", "permanent"], "action": "ignore"}
    rules = [any_200, transient, assertion]
    assert classify(rules, FC.ASSERTION).why.startswith("rule 3: failure class assertion")
    assert classify(rules, FC.TRANSIENT, status=404).why.startswith("rule 2: failure class")
    assert classify(rules, FC.TRANSIENT, status=503).why.startswith("rule 1: HTTP status 503")
    assert classify([transient], None, status=None).cls == FC.UNKNOWN


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"on_failure_classes": ["unknown"], "action": "retry"}, "on_failure_classes.0"),
        ({"on_failure_classes": [], "action": "retry"}, "at least 1 item"),
        ({"on_failure_classes": ["assertion", "assertion"], "action": "retry"}, "must not repeat"),
        (
            {
                "on_failure_classes": ["assertion"],
                "on_http_statuses": {"operator": "In", "values": [404]},
                "action": "retry",
            },
            "on_exit_codes, on_http_statuses or on_failure_classes: give one",
        ),
    ],
)
def test_a_bad_class_rule_is_refused(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        JobPolicy.model_validate({"failure_rules": [rule]})
