"""Kubernetes' published schemas (kubernetes-validate's strict ones) of every version corral
supports, part by part: where a core/v1 object (a Volume, an Affinity, a security context)
first breaks one, and its rule.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

SUPPORTED_VERSIONS = ("1.31", "1.37")
"""The oldest and the newest Kubernetes version whose schemas every object is checked against."""


def schema_problem(value: Any, kind: str) -> tuple[str, str] | None:
    """Where in `value` (a dotted path, "" for the top) the strict schema of core/v1 `kind`
    (Volume, Affinity, ...) of a supported version first finds it wrong, and its rule;
    None when every supported version takes it."""
    for version in SUPPORTED_VERSIONS:
        error = jsonschema.exceptions.best_match(validator(kind, version).iter_errors(value))
        if error is not None:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
            return where, f"{error.message} (Kubernetes {version} schema)"
    return None


@functools.cache
def validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    """The strict schema of core/v1 `kind` in Kubernetes `version`, read once."""
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    strict = folder / f"v{version}.0-local-strict"
    schema = json.loads((strict / f"{kind.lower()}-v1.json").read_text(encoding="utf-8"))
    definitions = json.loads((strict / "_definitions.json").read_text(encoding="utf-8"))
    registry: referencing.Registry[Any] = referencing.Registry()
    registry = referencing.jsonschema.DRAFT202012.create_resource(schema) @ registry
    registry = referencing.jsonschema.DRAFT202012.create_resource(definitions) @ registry
    made: jsonschema.protocols.Validator = jsonschema.Draft202012Validator(
        schema, registry=registry
    )
    return made
