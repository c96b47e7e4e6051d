"""Alert channels and rules a tenant owns, as values (pure): what a request may say of
them, and what the alerter makes of them as stored.

A tenant's rule becomes the same `AlertRule` the settings' rules are, named
`tenant:TENANT/NAME` (so it meets no rule of the settings, nor another tenant's, in the
outbox, the history or a mute), its channels so named too, and its `match` narrowed to
its own tenant every time it is read: whatever was stored, it can match no other
tenant's jobs. Its channels are the settings' kinds: e-mail through the operator's
`alerts.tenant_smtp`, a Slack incoming webhook, a signed webhook.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

import pydantic

from corral import alert_settings, errors, redaction

MAX_CHANNELS = 20
"""The most alert channels one tenant may have."""
MAX_RULES = 50
"""The most alert rules one tenant may have."""
TESTS_A_MINUTE = 5
"""The most test messages one tenant's channels may send in a minute."""
MAX_ADDRESSES = 20
"""The most addresses one e-mail channel sends to."""

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A channel's or a rule's name, within its tenant."""

CHANNEL_FIELDS = {"email": ("to",), "slack": ("webhook_url",), "webhook": ("url", "secret")}
"""Each kind's own fields, beside name, kind and tenant."""
RULE_FIELDS = ("on", "match", "channels", "throttle", "after", "late_by")
"""A rule's own fields, beside name and tenant."""
NO_SMTP = (
    "kind: a tenant's e-mail channel sends through the operator's alerts.tenant_smtp.url"
    " and alerts.tenant_smtp.from, which are not set"
)


def qualified(tenant: str, name: str) -> str:
    """How the outbox, the history and mutes name a tenant's rule or channel."""
    return f"{alert_settings.TENANT_PREFIX}{tenant}/{name}"


def name_checked(name: Any) -> str:
    """`name`, when it may name a channel or a rule; InvalidInput naming the field if not."""
    if not isinstance(name, str) or not NAME.match(name):
        raise errors.InvalidInput(
            "name: required: letters, digits, '_', '.' and '-', at most 100, beginning with"
            " a letter or a digit"
        )
    return name


def channel_kind(kind: Any, field: str = "kind") -> str:
    """`kind`, when it is a channel's kind; InvalidInput naming `field` if not (a list or a
    mapping too, never looked up as a key)."""
    if not isinstance(kind, str) or kind not in CHANNEL_FIELDS:
        raise errors.InvalidInput(f"{field}: required, one of {', '.join(CHANNEL_FIELDS)}")
    return kind


def _only(given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    if unknown := sorted(set(given) - set(allowed)):
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")


def _url(given: Mapping[str, Any], field: str) -> str:
    url = given.get(field)
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        raise errors.InvalidInput(f"{field}: required, an http:// or https:// URL")
    if len(url) > 2000:
        raise errors.InvalidInput(f"{field}: at most 2000 characters")
    return url


def channel_config(
    given: Mapping[str, Any], settings: alert_settings.AlertsSettings
) -> tuple[str, dict[str, Any]]:
    """A channel's kind and its fields to store, from a request's body (without name and
    tenant); InvalidInput naming the field and the rule."""
    kind = channel_kind(given.get("kind"))
    _only(given, ("kind", *CHANNEL_FIELDS[kind]))
    if kind == "email":
        if settings.tenant_smtp is None:
            raise errors.InvalidInput(NO_SMTP)
        to = given.get("to")
        if isinstance(to, str):
            to = [to]
        if not isinstance(to, list) or not 1 <= len(to) <= MAX_ADDRESSES:
            raise errors.InvalidInput(f"to: required, 1 to {MAX_ADDRESSES} e-mail addresses")
        for address in to:
            try:
                alert_settings.email_address(address if isinstance(address, str) else "")
            except ValueError:
                raise errors.InvalidInput(f"to: {address!r} is not an e-mail address") from None
        return kind, {"to": to}
    if kind == "slack":
        return kind, {"webhook_url": _url(given, "webhook_url")}
    secret = given.get("secret")
    if secret is not None and not (isinstance(secret, str) and secret.startswith("whsec_")):
        raise errors.InvalidInput("secret: a whsec_... signing secret, or left out (unsigned)")
    return kind, {"url": _url(given, "url"), "secret": secret}


def channel_url(kind: str, config: Mapping[str, Any]) -> str | None:
    """Where a web channel posts (None: an e-mail channel)."""
    found = config.get("webhook_url" if kind == "slack" else "url")
    return found if isinstance(found, str) else None


def channel_of(
    kind: str, config: Mapping[str, Any], settings: alert_settings.AlertsSettings
) -> alert_settings.EmailChannel | alert_settings.SlackChannel | alert_settings.WebhookChannel:
    """A stored channel as the settings' channel of its kind; errors.Undelivered for an
    e-mail channel while the operator's alerts.tenant_smtp is not set."""
    if kind == "email":
        if settings.tenant_smtp is None:
            raise errors.Undelivered(NO_SMTP.removeprefix("kind: "))
        return settings.tenant_smtp.channel(tuple(config["to"]))
    if kind == "slack":
        return alert_settings.SlackChannel(kind="slack", webhook_url=config["webhook_url"])
    return alert_settings.WebhookChannel(
        kind="webhook", url=config["url"], secret=config.get("secret")
    )


def rule_config(given: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """A rule's fields to store, from a request's body (without name and tenant), checked
    as a rule of the settings is; InvalidInput naming the field and the rule. Its match
    may name no other tenant."""
    _only(given, RULE_FIELDS)
    match = given.get("match", {})
    if isinstance(match, Mapping) and match.get("tenant") not in (None, tenant):
        raise errors.InvalidInput(
            f"match.tenant: a tenant's rule matches its own tenant's jobs only ({tenant!r})"
        )
    try:
        alert_settings.AlertRule.model_validate(dict(given))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("literal")) or "on"
        raise errors.InvalidInput(f"{where}: {first['msg']}") from None
    stored = {k: given[k] for k in RULE_FIELDS if k in given}
    if isinstance(match, Mapping):
        stored["match"] = {k: v for k, v in match.items() if k != "tenant"}
    return stored


def rule_of(tenant: str, stored: Mapping[str, Any]) -> alert_settings.AlertRule:
    """A stored rule of `tenant` as the alerter reads it: its match narrowed to `tenant`
    (whatever was stored), its channels named as the outbox names them."""
    fields = {k: v for k, v in stored.items() if k in RULE_FIELDS}
    match = dict(fields.get("match") or {})
    fields["match"] = {**match, "tenant": tenant}
    fields["channels"] = [qualified(tenant, c) for c in fields.get("channels", ())]
    return alert_settings.AlertRule.model_validate(fields)


def shown_config(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """A channel's fields as they may be shown: a web channel's URL as its origin alone
    (its path or query holds the secret), whether it signs, never the secret."""
    if kind == "email":
        return {"to": list(config.get("to", ()))}
    url = channel_url(kind, config) or ""
    parts = urllib.parse.urlsplit(url)
    origin = f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    shown = f"{origin}/{redaction.REDACTED}"
    if kind == "slack":
        return {"webhook_url": shown}
    return {"url": shown, "signed": bool(config.get("secret"))}
