"""What each of a job's command-line options says, as the job's fields: its spec (a
command, --spec, or --http and its options), its policy (--policy with the shortcuts
--deadline, --heartbeat, --on-unknown, --sla), its labels and its payload. Each refuses
what it cannot read, naming the option."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from corral import errors, model
from corral.cli.common import parse_json
from corral.executors import registry


def labels_from(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"--label {pair!r}: use KEY=VALUE")
        model.check_label(key, value)
        labels[key] = value
    return labels


def policy_from(
    text: str | None,
    *,
    deadline: str | None,
    heartbeat: bool,
    on_unknown: str | None,
    sla: str | None = None,
) -> dict[str, Any]:
    """--policy, with the shortcut options (--deadline, --heartbeat, --on-unknown, --sla)
    added.
    A shortcut that says something else than --policy is refused: neither wins silently."""
    policy = parse_json("--policy", text)
    if text is not None and not isinstance(policy, dict):
        raise errors.InvalidInput(
            f'--policy: must be a JSON object, e.g. \'{{"limits": {{"attempt_deadline":'
            f' "30s"}}}}\', not {text.strip()!r}'
        )
    policy = dict(policy or {})
    if deadline is not None:
        _seconds(deadline, "--deadline")
        limits = policy.get("limits")
        limits = dict(limits) if isinstance(limits, dict) else {}
        given = limits.get("attempt_deadline")
        if given is not None and _seconds(given) != _seconds(deadline, "--deadline"):
            raise errors.InvalidInput(
                f"--deadline {deadline} and --policy limits.attempt_deadline {given} disagree;"
                " give one of them"
            )
        limits["attempt_deadline"] = deadline
        policy["limits"] = limits
    _agree(policy, "heartbeat", True if heartbeat else None, "--heartbeat")
    _agree(policy, "on_unknown", on_unknown, "--on-unknown")
    if sla is not None:
        _seconds(sla, "--sla")
    _agree(policy, "sla", sla, "--sla")
    return policy


def _agree(policy: dict[str, Any], field: str, value: Any, option: str) -> None:
    if value is None:
        return
    if field in policy and policy[field] != value:
        raise errors.InvalidInput(
            f"{option} and --policy {field} {json.dumps(policy[field])} disagree; give one of them"
        )
    policy[field] = value


def _seconds(value: Any, where: str = "--policy limits.attempt_deadline") -> timedelta | None:
    from corral import durations

    try:
        return durations.parse_duration(value)
    except ValueError as exc:
        if where in ("--deadline", "--sla"):
            raise errors.InvalidInput(f"{where}: {exc}") from None
        return None  # the policy's own check names it


def spec_from(
    executor: str,
    command: tuple[str, ...],
    spec_json: str | None,
    *,
    image: str | None,
    placement: str | None,
) -> Any:
    """The executor spec from --spec (checked by its executor), or from the command."""
    spec = parse_json("--spec", spec_json)
    if spec_json is not None:
        if command or image or placement:
            raise errors.InvalidInput(
                "give either --spec or a command after -- (with --image, --placement), not both"
            )
        return spec
    containers = registry.containers()
    if executor in containers:
        made: dict[str, Any] = {"image": image, "command": list(command)}
        if placement is not None:
            made["placement"] = placement
        return made
    if image or placement:
        raise errors.InvalidInput(
            f"--image and --placement are for --executor {' or '.join(containers)}"
        )
    if not command:
        raise errors.InvalidInput(
            "nothing to run: give the command after --, e.g. corral submit -- echo hi"
        )
    return {"command": list(command)}


def payload_from(payload_json: str | None, payload_file: Any) -> Any:
    if payload_file is not None:
        if payload_json is not None:
            raise errors.InvalidInput("give either --payload or --payload-file, not both")
        try:
            payload_json = payload_file.read()
        except UnicodeDecodeError as exc:
            raise errors.InvalidInput(f"--payload-file: not UTF-8 text ({exc.reason})") from None
        return parse_json("--payload-file", payload_json)
    return parse_json("--payload", payload_json)


def http_spec(
    method: str,
    url: str,
    *,
    headers: tuple[str, ...],
    data: str | None,
    json_body: str | None,
    expect: str | None,
    assertions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `http` spec of --http and its options (the executor checks it at submit);
    `assertions` the spec's fields of --expect-body, --expect-json and --max-response-time
    (None: not given)."""
    spec: dict[str, Any] = {"method": method, "url": url}
    if headers:
        spec["headers"] = {}
        for name, value in map(_header, headers):
            if name.lower() in (given.lower() for given in spec["headers"]):
                raise errors.InvalidInput(f"--header {name}: given twice; give each header once")
            spec["headers"][name] = value
    if data is not None and json_body is not None:
        raise errors.InvalidInput("--data and --json-body: give one body, not both")
    if data is not None:
        spec["body"] = _read_data(data)
    if json_body is not None:
        spec["json"] = parse_json("--json-body", json_body)
    if expect is not None:
        spec["expect"] = expect
    spec.update({k: v for k, v in (assertions or {}).items() if v is not None})
    return spec


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise errors.InvalidInput(f"--header {line!r}: write it as 'Name: value'")
    return name.strip(), value.strip()


def _read_data(data: str) -> str:
    if not data.startswith("@"):
        return data
    try:
        with open(data[1:], encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.InvalidInput(f"--data {data}: cannot read it ({exc})") from None
