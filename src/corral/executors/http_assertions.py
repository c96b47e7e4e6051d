"""Assertions on an HTTP job's response (pure): `expect_body` (a regular expression the
body must contain), `expect_json` (`PATH OP VALUE` about the body as JSON) and
`max_response_time`. Checked and normalised at submit (`check_body`, `check_json`,
`check_max_time`: ValueError says the rule), judged on a response whose status succeeded
(`judge`). A response that fails one is a failure of class `assertion`.

A stranger writes the pattern, and Python's `re` can take exponential time on one
(`(a+)+$`) with no way to stop it: it would hold the dispatcher's event loop. So the
pattern is RE2's (linear in the body, no backreferences or lookaround), at most
MAX_PATTERN_CHARS long, compiled within PATTERN_MEMORY to at most MAX_PROGRAM_SIZE
instructions (one past any is refused at submit), and it is matched against what corral
read of the body: at most `executors.http.body_bytes` (64 KiB by default). Linear is not
free: a match takes up to the body's length times the program's size, so the HTTP
executor judges a response with `expect_body` off its event loop (RE2 lets the GIL go).

The JSONPath subset: `$` (the whole body), `.name` (a key: letters, digits, `_`, `-`),
`["any key"]` (a key as a JSON string) and `[N]` (an index, `[-1]` the last), e.g.
`$.data.items[0]["unit price"]`. OP is one of `==`, `!=`, `<`, `<=`, `>`, `>=`, `exists`;
VALUE a JSON literal (none after `exists`). `==` and `!=` compare JSON values (`1` is
`1.0`, `true` is not `1`); the order operators compare two numbers or two strings, and a
value of any other kind fails them.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from corral import durations, plain

MAX_ASSERTIONS = 20
"""The most `expect_json` assertions one job has."""
MAX_ASSERTION_CHARS = 1_000
"""The longest `expect_json` assertion."""
MAX_PATH_STEPS = 32
"""The most steps (`.name`, `[N]`) in one path."""
MAX_PATTERN_CHARS = 1_000
"""The longest `expect_body` pattern."""
PATTERN_MEMORY = 8 * 1024 * 1024
"""What RE2 may take to compile and run one pattern; a pattern that needs more is refused."""
MAX_PROGRAM_SIZE = 10_000
"""The most instructions an `expect_body` pattern compiles to (RE2's program size): the
time a match takes grows with it, up to the body's length times it. `[^x]{999}` is 7,996;
`\\pL{239}x` (285,849) is refused."""
SEEN_CHARS = 200
"""How much of a value seen a failed assertion quotes."""

ORDER = ("<=", ">=", "<", ">")
OPERATORS = ("==", "!=", *ORDER, "exists")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INDEX = re.compile(r"-?(?:0|[1-9][0-9]*)")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class JsonAssertion:
    """One `expect_json` assertion, parsed: where to look, how to compare, with what."""

    path: tuple[str | int, ...]
    op: str
    value: Any = None  # None after `exists` (and for a JSON null)

    @property
    def text(self) -> str:
        """As written back (the spec keeps this form): `$.a[0] == 1`."""
        said = f"{path_text(self.path)} {self.op}"
        return said if self.op == "exists" else f"{said} {_dumped(self.value)}"


@dataclass(frozen=True, slots=True)
class Check:
    """One assertion judged: what it says, whether it held, and what was seen."""

    name: str  # e.g. "expect_json $.ok == true"
    ok: bool
    seen: str  # e.g. "saw false"


@dataclass(frozen=True, slots=True)
class Response:
    """What the assertions read of a response: the body as read (and whether it went on),
    how long the request took, and its Content-Encoding."""

    body: bytes
    cut: bool
    seconds: float
    encoding: str | None = None


# --- checked at submit ------------------------------------------------------------------


def check_body(pattern: Any) -> str:
    """An `expect_body` pattern: a non-empty RE2 expression of at most MAX_PATTERN_CHARS."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("must be a regular expression (RE2 syntax), as a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"is {len(pattern):,} characters; a pattern has at most {MAX_PATTERN_CHARS:,}"
        )
    try:
        size = compiled(pattern).programsize
    except re2.error as exc:
        raise ValueError(f"{_said(exc)} (RE2 syntax: no backreferences or lookaround)") from None
    if size > MAX_PROGRAM_SIZE:
        raise ValueError(
            f"compiles to an RE2 program of {size:,} instructions; at most"
            f" {MAX_PROGRAM_SIZE:,} (a count such as {{200}} repeats its class, and a class"
            " such as \\pL is large: use a smaller count or a narrower class)"
        )
    return pattern


def check_json(given: Any) -> list[str]:
    """`expect_json` assertions (one string, or a list of them), each written back in its
    normal form; at most MAX_ASSERTIONS."""
    items = [given] if isinstance(given, str) else given
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError("must be an assertion 'PATH OP VALUE', or a list of them")
    if len(items) > MAX_ASSERTIONS:
        raise ValueError(f"{len(items)} assertions; at most {MAX_ASSERTIONS}")
    normal = []
    for item in items:
        try:
            normal.append(parse(item).text)
        except ValueError as exc:
            raise ValueError(f"{item!r}: {exc}") from None
    return normal


def check_max_time(given: Any) -> str:
    """`max_response_time`: a duration (`2s`, `500ms`, or seconds), written back as one."""
    try:
        return durations.format_duration(durations.parse_duration(given))
    except ValueError as exc:
        raise ValueError(str(exc)) from None


@functools.lru_cache(maxsize=256)
def compiled(pattern: str) -> Any:
    """The pattern compiled by RE2 within PATTERN_MEMORY, quietly (RE2 would log a
    refusal on stderr): re2.error when it is not one."""
    options = re2.Options()
    options.max_mem = PATTERN_MEMORY
    options.log_errors = False
    return re2.compile(pattern, options)


def _said(exc: Exception) -> str:
    said = exc.args[0] if exc.args else str(exc)
    return said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)


# --- the JSONPath subset ------------------------------------------------------------------


def parse(text: str) -> JsonAssertion:
    """One assertion, `PATH OP VALUE` (or `PATH exists`); ValueError names what is wrong."""
    if len(text) > MAX_ASSERTION_CHARS:
        raise ValueError(f"an assertion has at most {MAX_ASSERTION_CHARS:,} characters")
    path, at = parse_path(text.strip())
    rest = text.strip()[at:].strip()
    op = next((o for o in OPERATORS if rest.startswith(o)), None)
    if op is None:
        raise ValueError(f"after the path, an operator: one of {', '.join(OPERATORS)}")
    literal = rest[len(op) :].strip()
    if op == "exists":
        if literal:
            raise ValueError("exists takes no value")
        return JsonAssertion(path, op)
    if not literal:
        raise ValueError(f'{op} needs a value: a JSON literal (1, "text", true, null, ...)')
    try:
        value = json.loads(literal, parse_constant=_no_constant, parse_float=_finite)
    except _NotFinite as exc:
        raise ValueError(
            f"{exc} is not a finite number (a number here is at most about 1.8e308)"
        ) from None
    except ValueError:
        raise ValueError(
            f"{literal!r} is not a JSON literal (a string is in double quotes)"
        ) from None
    if op in ORDER and not (_number(value) or isinstance(value, str)):
        raise ValueError(f"{op} compares numbers or strings, not {_dumped(value)}")
    return JsonAssertion(path, op, value)


def parse_path(text: str) -> tuple[tuple[str | int, ...], int]:
    """The path at the start of `text` and where it ends: `$`, then `.name`, `["key"]` or
    `[N]` steps."""
    if not text.startswith("$"):
        raise ValueError("a path starts with $ (the whole body), e.g. $.status or $.items[0]")
    steps: list[str | int] = []
    at = 1
    while at < len(text) and text[at] in ".[":
        step, at = _step(text, at)
        steps.append(step)
        if len(steps) > MAX_PATH_STEPS:
            raise ValueError(f"a path has at most {MAX_PATH_STEPS} steps")
    return tuple(steps), at


def _step(text: str, at: int) -> tuple[str | int, int]:
    """One step at `at` (which is `.` or `[`), and where the next begins."""
    if text[at] == ".":
        name = _NAME.match(text, at + 1)
        if name is None:
            raise ValueError(f"at {text[at : at + 20]!r}: after . a name (letters, digits, _, -)")
        return name.group(), name.end()
    if text.startswith('["', at):
        try:
            key, end = _DECODER.raw_decode(text, at + 1)
        except ValueError:
            raise ValueError(
                f"at {text[at : at + 20]!r}: a key in brackets is a JSON string"
            ) from None
    elif index := _INDEX.match(text, at + 1):
        key, end = int(index.group()), index.end()
    else:
        raise ValueError(f'at {text[at : at + 20]!r}: in brackets, an index [0] or a key ["name"]')
    if not text.startswith("]", end):
        raise ValueError(f"at {text[at : at + 20]!r}: ] expected")
    return key, end + 1


def path_text(path: Sequence[str | int]) -> str:
    """A path as written: `$.a[0]["b c"]`."""
    parts = ["$"]
    for step in path:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif _NAME.fullmatch(step):
            parts.append(f".{step}")
        else:
            parts.append(f"[{json.dumps(step, ensure_ascii=False)}]")
    return "".join(parts)


def lookup(document: Any, path: Sequence[str | int]) -> tuple[bool, Any]:
    """(found, value) at `path` in a JSON document."""
    here = document
    for step in path:
        if isinstance(step, int):
            found = isinstance(here, list) and -len(here) <= step < len(here)
        else:
            found = isinstance(here, dict) and step in here
        if not found:
            return False, None
        here = here[step]
    return True, here


def holds(assertion: JsonAssertion, found: bool, value: Any) -> bool:
    """Whether the assertion holds of what its path found."""
    op, want = assertion.op, assertion.value
    if op == "exists" or not found:
        return found
    if op == "==":
        return same(value, want)
    if op == "!=":
        return not same(value, want)
    numbers = _number(value) and _number(want)
    if not (numbers or (isinstance(value, str) and isinstance(want, str))):
        return False
    return bool(
        {"<": value < want, "<=": value <= want, ">": value > want, ">=": value >= want}[op]
    )


def same(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 is 1.0), a boolean never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _NotFinite(ValueError):
    """A number of an assertion's value that a float cannot hold (`1e999`): it would be
    written back as `Infinity`, which is not JSON."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _dumped(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


# --- judged on a response -----------------------------------------------------------------


def given(spec: Mapping[str, Any]) -> bool:
    """Whether a (normalised) spec asserts anything beyond its status."""
    return any(k in spec for k in ("expect_body", "expect_json", "max_response_time"))


def judge(spec: Mapping[str, Any], response: Response) -> list[Check]:
    """Each assertion of a normalised spec, judged on a response whose status succeeded:
    max_response_time first, then expect_body, then each of expect_json, in order."""
    checks = []
    if (limit := spec.get("max_response_time")) is not None:
        checks.append(_time(limit, response.seconds))
    if (pattern := spec.get("expect_body")) is not None:
        checks.append(_body(pattern, response))
    if assertions := spec.get("expect_json"):
        document, why = _document(response)
        for text in assertions:
            checks.append(_json(parse(text), document, why))
    return checks


def _time(limit: str, seconds: float) -> Check:
    took = f"took {seconds * 1000:.0f} ms"
    ok = seconds <= durations.parse_duration(limit).total_seconds()
    return Check(f"max_response_time {limit}", ok, took)


def _body(pattern: str, response: Response) -> Check:
    name = f"expect_body /{pattern}/"
    if (why := _unreadable(response)) is not None:
        return Check(name, False, why)
    text = response.body.decode("utf-8", "replace")
    if compiled(pattern).search(text) is not None:
        return Check(name, True, "found")
    where = f"the first {len(response.body):,} bytes read" if response.cut else "the body"
    return Check(name, False, f"not in {where}, which begins {_quoted(text)}")


def _json(assertion: JsonAssertion, document: Any, why: str | None) -> Check:
    name = f"expect_json {assertion.text}"
    if why is not None:
        return Check(name, False, why)
    found, value = lookup(document, assertion.path)
    seen = f"saw {_quoted(_dumped(value))}" if found else f"nothing at {path_text(assertion.path)}"
    return Check(name, holds(assertion, found, value), seen)


def _document(response: Response) -> tuple[Any, str | None]:
    """The body as JSON, or why it could not be read as JSON."""
    if (why := _unreadable(response)) is not None:
        return None, why
    if response.cut:
        return (
            None,
            f"the body goes on past the {len(response.body):,} bytes read"
            " (executors.http.body_bytes): not judged",
        )
    try:
        return json.loads(response.body, parse_constant=_no_constant), None
    except (ValueError, RecursionError) as exc:
        head = response.body[:SEEN_CHARS].decode("utf-8", "replace")
        return None, f"the body is not JSON ({exc}): it begins {_quoted(head)}"


def _unreadable(response: Response) -> str | None:
    encoding = (response.encoding or "identity").strip().lower()
    if encoding != "identity":
        return (
            f"the body came {encoding}-encoded (the job's Accept-Encoding header asked for"
            " it): leave that header out"
        )
    return None


def _quoted(text: str) -> str:
    """What was seen as a failed check quotes it: its first SEEN_CHARS, a NUL of a binary
    body as U+FFFD (corral.plain: it goes into the attempt's reason and message)."""
    text = plain.mended_text(text)
    return text if len(text) <= SEEN_CHARS else f"{text[:SEEN_CHARS]}..."


def first_failed(checks: Sequence[Check]) -> Check | None:
    return next((c for c in checks if not c.ok), None)


def failure_text(check: Check, more: int = 0) -> str:
    """A failed check as the attempt's reason and message say it."""
    others = f"; and {more} more" if more else ""
    return f"assertion failed: {check.name} ({check.seen}){others}"


def stream_text(checks: Sequence[Check]) -> str:
    """The checks as the run log's `assertions` stream keeps them, a line each."""
    return "".join(f"{'passed' if c.ok else 'FAILED'}  {c.name}: {c.seen}\n" for c in checks)
