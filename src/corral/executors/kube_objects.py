"""Reading and naming the objects a cluster executor finds on the API server, as plain JSON:
their labels, timestamps and pods' states, a pod's log as the run log keeps it, launch
names on the cluster, and whether an object found under a launch's name (after a 409) is
that attempt's. Pure: the calls that fetch them are kube_calls.py's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from corral import config, errors, launching, model
from corral.executors import base

log = logging.getLogger("corral.executors.kubernetes")

LOG_LINES = 10_000
"""How many last lines of a finished pod's log the first read asks for (`tailLines`)."""
LOG_READ_BYTES = 4 * launching.STREAM_BYTES
"""The most one read of a pod's log takes (`limitBytes`). The kubelet counts it from the
start of the lines asked for, so a read that reaches it is made again for fewer lines
(as many as STREAM_BYTES holds at the first read's line length): the run log keeps a
log's end."""
LOG_STREAM = "log"
"""The run log's stream of a pod's log: its main container's stdout and stderr together."""


def log_stream(data: bytes, *, limit: int = launching.STREAM_BYTES) -> launching.Stream:
    """A read of a pod's log as the run log keeps it: its last `limit` bytes, `cut` when
    that is not all of it (more than `limit`, or a read that reached LOG_LINES lines or
    LOG_READ_BYTES: the log went on before them)."""
    cut = len(data) > limit or len(data) >= LOG_READ_BYTES or data.count(b"\n") >= LOG_LINES
    text = launching.decoded(data[-limit:], cut_before=len(data) > limit)
    return launching.Stream(LOG_STREAM, text, len(data), cut)


def log_note(why: str) -> launching.Stream:
    """The run log's stream in place of a pod log that could not be read: why not."""
    text = f"(no pod log: {why})"
    return launching.Stream(LOG_STREAM, text, 0)


def first_launch(job: model.NewJob, settings: config.Settings, now: datetime) -> launching.Launch:
    """The Launch of the first attempt of `job` (validated, not stored: its job id and fence
    are placeholders, 0) as a cluster executor names it: for a dry run's manifest."""
    launch = base.launch_for(model.first_claim(job, now), settings, now)
    name = platform_name(launch.name, settings.executors.kubernetes.name_prefix)
    return dataclasses.replace(launch, name=name)


def platform_name(name: str, prefix: str) -> str:
    """A launch's name on a cluster: `corral-42-1` with `prefix` in place of `corral`."""
    rest = name.removeprefix(model.LAUNCH_NAME_PREFIX)
    return f"{prefix}-{rest}" if rest != name else name


def pod_ended(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers have all ended (Succeeded or Failed): a pod being
    deleted runs on until then, for as long as its termination grace."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def describe_pod(pod: Mapping[str, Any]) -> str:
    """A pod in words, for the run log: `pod corral-5-1-x7kq2 (Terminating)`."""
    meta = pod.get("metadata") or {}
    phase = (
        "Terminating"
        if meta.get("deletionTimestamp")
        else (pod.get("status") or {}).get("phase", "Pending")
    )
    return f"pod {meta.get('name')} ({phase})"


def selector_text(selector: Mapping[str, str]) -> str:
    """A label selector (`k=v,...`) for these labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def items(listing: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [i for i in (listing or {}).get("items") or [] if isinstance(i, dict)]


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (obj.get("metadata", {}).get("labels") or {}).items()}


def timestamp(value: Any) -> datetime | None:
    """An API timestamp (RFC 3339) as an aware datetime."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def live_pod(pod: Mapping[str, Any]) -> bool:
    """A pod that runs or may still run, and that no one is deleting yet."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def last_line(text: Any) -> str | None:
    """The last non-empty line of a termination message or log tail."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:500] if lines else None


def check_existing(
    what: str, found: dict[str, Any] | None, launch: launching.Launch
) -> dict[str, Any]:
    """After a 409 on create: `found` if it is this attempt's and not being deleted (the
    create got through before, its answer was lost); else raise."""
    if found is None:
        raise errors.ExecutorError(
            f"creating {what}: 409 AlreadyExists, but it was gone when read back (deleted"
            " meanwhile); it will be tried again"
        )
    foreign(what, found, launch)
    theirs = model.identity_from_labels(labels_of(found))
    deleting = found.get("metadata", {}).get("deletionTimestamp")
    if theirs == launch.identity and not deleting:
        log.info("%s: already exists with this attempt's labels: launched", what)
        return found
    state = (
        f"is being deleted (since {deleting})"
        if theirs == launch.identity
        else f"belongs to {model.describe_identity(theirs, labels_of(found))}"
    )
    raise errors.LaunchConflict(
        f"{what} exists and {state}; this launch is"
        f" {model.describe_identity(launch.identity, launch.labels)}"
    )


def foreign(what: str, found: Mapping[str, Any], launch: launching.Launch) -> None:
    """LaunchConflict when `found`, holding the name `launch` wants, is another corral
    installation's (its installation label is not the launch's). One with no such label is
    an earlier corral's, this installation's or not: its identity labels decide."""
    theirs = labels_of(found).get(model.INSTALLATION)
    mine = launch.labels.get(model.INSTALLATION)
    if theirs is not None and mine is not None and theirs != mine:
        raise errors.LaunchConflict(
            f"{what} exists and belongs to another corral installation ({theirs}; this one is"
            f" {mine}) in the same namespace: give each installation its own"
            " executors.kubernetes.name_prefix"
        )


def owned_by(
    what: str,
    found: Mapping[str, Any] | None,
    launch: launching.Launch,
    owners: Sequence[Mapping[str, Any]],
) -> bool:
    """After a 409 on a launch's ConfigMap or Secret: whether `found` is this attempt's and has the
    owner(s) `owners` already (False: this attempt's, but another owner's). ExecutorError
    when it is gone or being deleted, LaunchConflict when another attempt's."""
    if found is None:
        raise errors.ExecutorError(
            f"creating {what}: 409 AlreadyExists, but it was gone when read back (deleted"
            " meanwhile); it will be tried again"
        )
    foreign(what, found, launch)
    theirs = model.identity_from_labels(labels_of(found))
    if theirs != launch.identity:
        raise errors.LaunchConflict(
            f"{what} exists and belongs to {model.describe_identity(theirs, labels_of(found))};"
            f" this launch is {model.describe_identity(launch.identity, launch.labels)}"
        )
    meta = found.get("metadata") or {}
    if deleting := meta.get("deletionTimestamp"):
        raise errors.ExecutorError(
            f"creating {what}: it is being deleted (since {deleting}); it will be made again"
            " by a later launch"
        )
    held = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    return {ref.get("uid") for ref in owners} <= held
