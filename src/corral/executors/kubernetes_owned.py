"""What a cluster launch makes beside its Job or Workflow, owned by it so that it goes when
its owner goes: the ConfigMap of a payload too large for the environment (`Payload`
says where a payload travels) and the Secret of the attempt token. The `kubernetes` and
`argo` executors make the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral import errors, launching

ATTEMPT_TOKEN = "CORRAL_ATTEMPT_TOKEN"
ATTEMPT_TOKEN_KEY = "token"
"""The attempt token's key in its Secret."""


PAYLOAD_ENV_BYTES = 32 * 1024
"""The largest payload (JSON, UTF-8 bytes) passed in CORRAL_PAYLOAD; larger ones go in a
ConfigMap. Well under what a process's environment holds (Linux: 128 KiB a variable)."""
CONFIG_MAP_BYTES = 1024 * 1024
"""The most a ConfigMap's data may hold (the API server's rule): the largest payload a
cluster launch carries."""
PAYLOAD_DIR = "/var/run/corral/payload"
"""Where a payload's ConfigMap is mounted in the container."""
PAYLOAD_KEY = "payload.json"
"""The payload's key in its ConfigMap: its file name under PAYLOAD_DIR."""
PAYLOAD_VOLUME = "corral-payload"
READ_ONLY = 0o444


@dataclass(frozen=True, slots=True)
class Payload:
    """How a launch's payload reaches its container: `text` is its JSON (None: a null
    payload, nothing to deliver), `size` its UTF-8 bytes. Up to PAYLOAD_ENV_BYTES it is the
    value of CORRAL_PAYLOAD; beyond, it is `mounted`: a ConfigMap's file, which
    CORRAL_PAYLOAD_FILE names."""

    text: str | None
    size: int

    @classmethod
    def of(cls, launch: launching.Launch) -> Payload:
        text = launching.payload_json(launch.payload)
        return cls(text, 0 if text is None else len(text.encode("utf-8")))

    @property
    def mounted(self) -> bool:
        return self.size > PAYLOAD_ENV_BYTES

    def env(self) -> dict[str, str]:
        """The variables that say where the payload is (none for a null payload)."""
        if self.text is None:
            return {}
        if self.mounted:
            return {"CORRAL_PAYLOAD_FILE": f"{PAYLOAD_DIR}/{PAYLOAD_KEY}"}
        return {"CORRAL_PAYLOAD": self.text}

    def volume(self, name: str) -> dict[str, Any]:
        """The pod's volume of the ConfigMap `name` (not optional: the pod waits for it)."""
        return {"name": PAYLOAD_VOLUME, "configMap": {"name": name, "defaultMode": READ_ONLY}}

    def check_size(self, doing: str) -> None:
        """LaunchRefused when no ConfigMap can hold the payload (max_payload_bytes was set
        above CONFIG_MAP_BYTES): before anything is created, so nothing is left half-made."""
        if self.size > CONFIG_MAP_BYTES:
            raise errors.LaunchRefused(
                f"{doing}: its payload is {self.size} bytes of JSON, more than a ConfigMap"
                f" holds ({CONFIG_MAP_BYTES}); keep max_payload_bytes at most that for jobs on"
                " a cluster, or pass a reference to the data instead"
            )


PAYLOAD_MOUNT = {"name": PAYLOAD_VOLUME, "mountPath": PAYLOAD_DIR, "readOnly": True}
"""Where the container sees a mounted payload."""


def owner_reference(api_version: str, kind: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """A reference to `owner` (an object as the API server returned it, uid and all) that
    makes its dependent go when it goes, and, deleted in the foreground, go first."""
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": False,
        "blockOwnerDeletion": True,
    }


def payload_config_map(
    launch: launching.Launch, payload: Payload, *, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The v1 ConfigMap that holds a payload too large for the environment: named after the
    launch, with its labels, immutable, and owned by `owner` (an owner_reference)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _owned_metadata(launch, namespace, owner),
        "immutable": True,
        "data": {PAYLOAD_KEY: payload.text or "null"},  # held only when past the env's limit
    }


def attempt_secret(
    launch: launching.Launch, *, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The v1 Secret that holds `launch`'s attempt token (None when it has none): named
    after the launch, with its labels, immutable, and owned by `owner` (an owner_reference)."""
    token = launch.env.get(ATTEMPT_TOKEN)
    if not token:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _owned_metadata(launch, namespace, owner),
        "type": "Opaque",
        "immutable": True,
        "stringData": {ATTEMPT_TOKEN_KEY: token},
    }


def owned_objects(
    launch: launching.Launch, payload: Payload, *, namespace: str, owner: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """What a launch makes after its Job or Workflow, owned by it: the ConfigMap of a
    payload too large for the environment, and the Secret of its attempt token."""
    made = []
    if payload.mounted:
        made.append(payload_config_map(launch, payload, namespace=namespace, owner=owner))
    if (secret := attempt_secret(launch, namespace=namespace, owner=owner)) is not None:
        made.append(secret)
    return made


def _owned_metadata(
    launch: launching.Launch, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": launch.name,
        "namespace": namespace,
        "labels": dict(launch.labels),
        "ownerReferences": [dict(owner)],
    }
    if launch.annotations:
        metadata["annotations"] = dict(launch.annotations)
    return metadata
