"""Secrets kept out of sight: the one table of names whose values are secrets, and the
redaction every surface that shows a spec, a URL or a log line applies (API, CLI, run log,
serve log).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"

SECRET_NAMES = {
    "contains": (
        "authorization", "cookie", "passw", "secret", "token", "signature", "credential",
        "session", "private-key", "private_key", "privatekey", "apikey", "api-key",
        "api_key", "access-key", "access_key",
    ),
    "is": ("auth", "key", "sig", "pwd", "pass", "jwt"),
    "ends with": ("-auth", "_auth", "-key", "_key", "-sig", "_sig", "-pwd", "_pwd"),
}  # fmt: skip
"""The one table of names whose values are secrets, for every surface that shows a spec,
a URL or a log line (API, CLI, run log, serve log): a key, a header or a query parameter
whose name, in any case, contains, is, or ends with one of these."""

_URL_QUERY = re.compile(
    r"^(?P<head>[a-z][a-z0-9+.-]*://[^?#]*\?)(?P<query>[^#]*)(?P<tail>#.*)?$", re.I
)
_USERINFO = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@?#]*@", re.IGNORECASE)
_URL_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def names_a_secret(name: str) -> bool:
    """Whether a key, a header or a parameter name says its value is a secret (by
    SECRET_NAMES)."""
    n = name.lower()
    return (
        n in SECRET_NAMES["is"]
        or any(part in n for part in SECRET_NAMES["contains"])
        or n.endswith(SECRET_NAMES["ends with"])
    )


def redacted_text(text: str) -> str:
    """Free text (a log line, an error) with every URL in it redacted (`redacted`)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: _redacted_url(m[0]), text)


def redacted(value: Any, placeholder: str = REDACTED) -> Any:
    """`value` (a spec, a template) as it may be shown: the values of keys that name a
    secret (Authorization, cookies, tokens, keys, passwords), the password of a URL and
    the secret-named parameters of its query replaced by `placeholder` (REDACTED; an
    export's KEPT). Nothing is changed in place; what is stored stays whole, for the
    executor."""
    if isinstance(value, Mapping):
        return {
            k: placeholder
            if isinstance(k, str) and names_a_secret(k) and v
            else redacted(v, placeholder)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redacted(v, placeholder) for v in value]
    if isinstance(value, str) and "://" in value:
        return _redacted_url(value, placeholder)
    return value


def _redacted_url(url: str, placeholder: str = REDACTED) -> str:
    url = _USERINFO.sub(lambda m: f"{m['scheme']}{placeholder}@", url)
    if (m := _URL_QUERY.match(url)) is None:
        return url
    params = []
    for part in m["query"].split("&"):
        name, eq, _ = part.partition("=")
        params.append(f"{name}={placeholder}" if eq and names_a_secret(name) else part)
    return f"{m['head']}{'&'.join(params)}{m['tail'] or ''}"


def restored(given: Any, stored: Any, placeholder: str = REDACTED) -> Any:
    """`given` (a value shown `redacted` and sent back, perhaps changed) with each
    `placeholder` left where `redacted` put one over `stored` replaced by what `stored`
    holds there: a secret-named key's value (a header's name matched in any case), a URL's
    user information, a secret-named parameter of its query. A placeholder with nothing
    stored behind it stays, for the caller to refuse (`left`). Nothing is changed in place."""
    if isinstance(given, Mapping):
        kept = stored if isinstance(stored, Mapping) else {}
        return {k: _restored_value(k, v, kept, placeholder) for k, v in given.items()}
    if isinstance(given, list) and isinstance(stored, list | tuple) and len(given) == len(stored):
        return [restored(g, s, placeholder) for g, s in zip(given, stored, strict=True)]
    if isinstance(given, str) and placeholder in given and isinstance(stored, str):
        return _restored_url(given, stored, placeholder)
    return given


def _restored_value(key: Any, value: Any, stored: Mapping[Any, Any], placeholder: str) -> Any:
    """A mapping's value sent back: a secret-named key's placeholder is its stored value."""
    if key in stored:
        before = stored[key]
    else:  # a header's name in another case
        lower = key.lower() if isinstance(key, str) else key
        same = [k for k in stored if isinstance(k, str) and k.lower() == lower]
        before = stored[same[0]] if same else None
    if value == placeholder and isinstance(key, str) and names_a_secret(key) and before:
        return before
    return restored(value, before, placeholder)


def left(value: Any, placeholder: str, path: str = "") -> str | None:
    """Where (a dotted path) a `placeholder` stands that `restored` found nothing stored
    behind: a secret-named key's value, or a URL's user information or secret-named
    parameter; None when there is none."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if v == placeholder and isinstance(k, str) and names_a_secret(k):
                return where
            if (found := left(v, placeholder, where)) is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if (found := left(v, placeholder, f"{path}[{i}]")) is not None:
                return found
    elif isinstance(value, str) and "://" in value and _url_holds(value, placeholder):
        return path
    return None


def _url_holds(url: str, placeholder: str) -> bool:
    """Whether `placeholder` stands as a URL's user information or a secret-named
    parameter's value."""
    if (m := _USERINFO.match(url)) is not None and url.startswith(f"{m['scheme']}{placeholder}@"):
        return True
    if (q := _URL_QUERY.match(url)) is None:
        return False
    pairs = (part.partition("=") for part in q["query"].split("&"))
    return any(eq and value == placeholder and names_a_secret(name) for name, eq, value in pairs)


def _restored_url(given: str, stored: str, placeholder: str = REDACTED) -> str:
    """A URL sent back: its placeholder user information and secret-named query parameters
    (by name, in order) are the stored URL's."""
    if (m := _USERINFO.match(stored)) is not None and given.startswith(
        f"{m['scheme']}{placeholder}@"
    ):
        given = stored[: m.end()] + given[len(m["scheme"]) + len(placeholder) + 1 :]
    shown, kept = _URL_QUERY.match(given), _URL_QUERY.match(stored)
    if shown is None or kept is None:
        return given
    values: dict[str, list[str]] = {}
    for part in kept["query"].split("&"):
        name, eq, value = part.partition("=")
        if eq and names_a_secret(name):
            values.setdefault(name, []).append(value)
    params = []
    for part in shown["query"].split("&"):
        name, eq, value = part.partition("=")
        if eq and value == placeholder and values.get(name):
            part = f"{name}={values[name].pop(0)}"
        params.append(part)
    return f"{shown['head']}{'&'.join(params)}{shown['tail'] or ''}"
