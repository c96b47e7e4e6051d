"""The Roles corral and its jobs need on a cluster: exactly the calls the executors make.

Each cluster executor says which API calls it makes (its Registration's `rules`): the
verbs corral's own service account needs (`corral`), and those the service accounts its
jobs' pods run as need (`pods`: Argo's executor, in each Workflow pod, records its results
in workflowtaskresults). `corral deploy rbac` turns the enabled executors' rules into
manifests, one Role and RoleBinding a namespace jobs may run in:

    corral's ServiceAccount (in corral's namespace)
    Role `corral` + RoleBinding to it, in each of executors.kubernetes.namespaces
    Role `corral-pods` + RoleBinding to the jobs' accounts there, when an executor needs one

deploy/rbac.yaml is the command's output for deploy/config.yaml, and a test holds them
equal: a verb the code stops using goes from the Role with it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from corral import config

ACCOUNT_LABELS = {"app.kubernetes.io/name": "corral", "app.kubernetes.io/part-of": "corral"}
CORRAL_ROLE = "corral"
PODS_ROLE = "corral-pods"
DEFAULT_ACCOUNT = "default"
"""What a pod runs as when neither its spec nor the settings name a service account."""


@dataclass(frozen=True, slots=True)
class Rule:
    """Some verbs on one resource of one API group, and why they are needed."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class Rules:
    """What one executor needs: of corral's own account, and of its jobs' pods' accounts."""

    corral: tuple[Rule, ...]
    pods: tuple[Rule, ...] = field(default=())


def manifests(
    settings: config.Settings,
    rules: Sequence[Rules],
    *,
    namespace: str,
    account: str,
) -> list[dict[str, Any]]:
    """The ServiceAccount `account` in `namespace` (corral's own), and in each namespace
    jobs may run in, the Role of `rules`' corral verbs bound to it and, when any rule is
    for pods, the Role of those bound to the service accounts jobs may run as."""
    k8s = settings.executors.kubernetes
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(account, namespace),
        }
    ]
    corral_rules = _merged(r for each in rules for r in each.corral)
    pod_rules = _merged(r for each in rules for r in each.pods)
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    for where in k8s.namespaces_allowed:
        docs += _role_and_binding(CORRAL_ROLE, where, corral_rules, subjects)
        if pod_rules:
            accounts = (*k8s.accounts_allowed, *(() if k8s.service_account else (DEFAULT_ACCOUNT,)))
            pods = [{"kind": "ServiceAccount", "name": a, "namespace": where} for a in accounts]
            docs += _role_and_binding(PODS_ROLE, where, pod_rules, pods)
    return docs


def render(docs: Sequence[dict[str, Any]], rules: Sequence[Rules], command: str) -> str:
    """`docs` as one YAML file, each rule of a Role after a comment that says why."""
    reasons: dict[tuple[str, str], list[str]] = {}  # each executor's, where two need a resource
    for rule in (r for each in rules for r in (*each.corral, *each.pods)):
        said = reasons.setdefault((rule.group, rule.resource), [])
        if rule.why not in said:
            said.append(rule.why)
    head = (
        f"# Made by `{command}`: what corral, and the pods of its jobs, may do in the\n"
        "# namespaces jobs run in: exactly the API calls the enabled executors make. Do not\n"
        "# edit it: run the command again after changing executors, namespaces or accounts.\n"
    )
    parts = []
    for doc in docs:
        if doc["kind"] != "Role":
            parts.append(yaml.safe_dump(doc, sort_keys=False, width=100))
            continue
        text = yaml.safe_dump({k: v for k, v in doc.items() if k != "rules"}, sort_keys=False)
        lines = ["rules:"]
        for rule in doc["rules"]:
            [group], [resource] = rule["apiGroups"], rule["resources"]
            why = "; ".join(reasons[(group, resource)])
            lines += [f"  # {line}" for line in textwrap.wrap(why, 86)]
            lines += [
                f"  - apiGroups: {json.dumps(rule['apiGroups'])}",
                f"    resources: {json.dumps(rule['resources'])}",
                f"    verbs: {json.dumps(rule['verbs'])}",
            ]
        parts.append(text + "\n".join(lines) + "\n")
    return head + "---\n".join(parts)


def _role_and_binding(
    name: str, namespace: str, rules: Sequence[Rule], subjects: list[dict[str, str]]
) -> list[dict[str, Any]]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, namespace),
        "rules": [
            {"apiGroups": [r.group], "resources": [r.resource], "verbs": list(r.verbs)}
            for r in rules
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects,
    }
    return [role, binding]


def _merged(rules: Iterable[Rule]) -> list[Rule]:
    """One rule a resource, its verbs joined in their first order, resources in theirs."""
    out: dict[tuple[str, str], Rule] = {}
    for rule in rules:
        key = (rule.group, rule.resource)
        if (had := out.get(key)) is None:
            out[key] = rule
        else:
            verbs = (*had.verbs, *(v for v in rule.verbs if v not in had.verbs))
            out[key] = Rule(had.group, had.resource, verbs, had.why)
    return list(out.values())


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(ACCOUNT_LABELS)}
