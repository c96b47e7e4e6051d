"""What text corral takes and stores: JSON values the databases can hold, whatever edge
they come in by (the API, the dashboard's forms, the CLI's arguments).

Two things in a Python string are not text a database can hold: a NUL character
(PostgreSQL's text and JSONB refuse it) and a lone surrogate (`"\\ud800"`, which JSON's
escapes allow and the shell's undecodable bytes become): it has no UTF-8 form, so a page
or list that holds one could not be sent. Both are refused at the edge, naming the field;
a number that is NaN or infinite too (it is not JSON). A value stored before these checks
is still shown, escaped (`shown`).

What a job makes is not refused but mended (`mended`, `mended_text`): its output, its
return value, the reason and message its attempt ends with come from a stranger's program
or a server, after the job was taken, and one that cannot be stored must not keep the
attempt's end (and every other end written with it) from being written. Each character a
database cannot hold becomes U+FFFD, as a run log's streams do (launching.Stream.as_json),
and a number JSON cannot hold its JSON-like text (`NaN`, `Infinity`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def fault(text: str) -> str | None:
    """The rule `text` breaks, or None when a database can hold it."""
    if "\x00" in text:
        return "must not hold a NUL character (\\u0000)"
    if _SURROGATE.search(text):
        return "must not hold a lone surrogate (\\ud800-\\udfff): it has no UTF-8 form"
    return None


def leaves(given: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every key and value under `given`, each with the dotted path of its field (keys
    with the path of the object holding them); iteratively, however deep."""
    top = prefix.rstrip(".") or "body"
    if not isinstance(given, Mapping | list):
        yield top, given
        return
    items = given.items() if isinstance(given, Mapping) else enumerate(given)
    stack: list[tuple[str, Any]] = [(f"{prefix}{k}", v) for k, v in items]
    if isinstance(given, Mapping):
        yield from ((top, k) for k in given)
    while stack:
        field, value = stack.pop()
        yield field, value
        if isinstance(value, Mapping):
            stack += [(f"{field}.{k}", v) for k, v in value.items()]
            yield from ((field, k) for k in value)
        elif isinstance(value, list | tuple):
            stack += [(f"{field}.{n}", v) for n, v in enumerate(value)]


def refusal(given: Any, prefix: str = "") -> str | None:
    """`field: rule` for the first value under `given` a database cannot hold (a string
    with a NUL or a lone surrogate, a number that is NaN or infinite); None if none."""
    for field, value in leaves(given, prefix):
        if isinstance(value, str) and (rule := fault(value)) is not None:
            return f"{field}: {rule}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{field}: must be a finite number, not NaN or Infinity"
    return None


def shown(text: str) -> str:
    """`text` as it can be sent: a lone surrogate as its escape (`\\ud800`)."""
    if text.isascii() or not _SURROGATE.search(text):  # isascii: a flag, read at once
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def mended_text(text: str) -> str:
    """`text` with each NUL and lone surrogate replaced by U+FFFD (itself when it has none)."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


def mended(given: Any) -> Any:
    """A JSON value as a database can hold it: every string (and key) `mended_text`, every
    number that is NaN or infinite as its text; `given` itself when nothing needs mending.
    Iteratively, however deep (a task's return value may nest as deep as JSON lets it)."""
    if refusal(given) is None:
        return given
    out: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(out, 0, given)]
    while stack:
        holder, key, value = stack.pop()
        if isinstance(value, Mapping):
            new: dict[Any, Any] = {}
            for k, v in value.items():
                k = mended_text(k) if isinstance(k, str) else k
                new[k] = None
                stack.append((new, k, v))
            holder[key] = new
        elif isinstance(value, list | tuple):
            items: list[Any] = [None] * len(value)
            stack += [(items, n, v) for n, v in enumerate(value)]
            holder[key] = items
        elif isinstance(value, str):
            holder[key] = mended_text(value)
        elif isinstance(value, float) and not math.isfinite(value):
            holder[key] = json.dumps(value)
        else:
            holder[key] = value
    return out[0]
