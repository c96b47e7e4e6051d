"""Tenants' grants: the default, `"*"` and what a named tenant takes from it, the refusal's
words, and the settings that are refused (naming the table and the rule)."""

from __future__ import annotations

import pydantic
import pytest

from corral import config, errors, tenancy
from corral.tenancy import TenantSettings


def test_a_tenant_may_use_http_and_python_unless_a_table_says_otherwise() -> None:
    assert tenancy.granted({}, "acme") == ("http", "python")
    tenants = {
        "*": TenantSettings(executors=("http",), max_running=None),
        "acme": TenantSettings(max_running=5),
        "ops": TenantSettings(executors=("http", "kubernetes")),
    }
    assert tenancy.granted(tenants, "other") == ("http",)  # "*" for every tenant not named
    assert tenancy.granted(tenants, "acme") == ("http",)  # what acme does not set: "*"'s
    assert tenancy.resolved(tenants, "acme").max_running == 5
    assert tenancy.granted(tenants, "ops") == ("http", "kubernetes")


def test_a_refusal_names_the_tenant_the_executor_and_the_setting() -> None:
    assert tenancy.refusal({}, "acme", "http") is None
    said = tenancy.refusal({}, "acme", "process")
    assert said == (
        "executor: tenant 'acme' is not granted 'process' (it may use: http, python); the"
        " operator grants it in corral.toml with [tenants.acme] executors = [..., 'process']"
    )
    with pytest.raises(errors.NotGranted, match="not granted 'argo'"):
        tenancy.check({}, "acme", "argo")


def test_a_form_is_offered_where_the_session_s_tenant_may_use_it() -> None:
    tenants = {"ops": TenantSettings(executors=("http", "kubernetes"))}
    assert tenancy.offered(tenants, "ops", "kubernetes")
    assert not tenancy.offered(tenants, "acme", "kubernetes")
    assert tenancy.offered(tenants, None, "kubernetes")  # a session of every tenant: any
    assert not tenancy.offered(tenants, None, "process")


@pytest.mark.parametrize(
    ("tenants", "said"),
    [
        ({"a b": {}}, "tenants.a b: a tenant's name is 1-200 characters"),
        ({"acme": {"executors": ["argo"]}}, "tenants.acme.executors: 'argo' is not in"),
        ({"*": {"executors": ["kubernetes"]}}, "tenants.\"*\".executors: 'kubernetes' is not"),
        ({"acme": {"executors": ["http", "http"]}}, "an executor is named twice"),
        ({"*": {"max_running": 3}}, 'tenants."*".max_running: a cap is set per tenant'),
        (
            {"acme": {"executors": ["process"]}},
            "granting 'process' runs a tenant's commands on corral's host",
        ),
        ({"acme": {"cpu": 2}}, "Extra inputs are not permitted"),
    ],
)
def test_settings_that_grant_wrongly_are_refused_naming_the_table(
    tenants: dict[str, dict[str, object]], said: str
) -> None:
    with pytest.raises(
        pydantic.ValidationError, match=said.replace("*", r"\*").replace(".", r"\.")
    ):
        config.Settings(tenants=tenants)  # type: ignore[arg-type]


def test_granting_an_enabled_executor_by_name_is_taken() -> None:
    s = config.Settings(
        tenants={"ops": {"executors": ["http", "kubernetes", "python"], "namespace": "ops"}},  # type: ignore[dict-item]
        executors={  # type: ignore[arg-type]
            "enabled": ["process", "http", "kubernetes"],
            "kubernetes": {"namespaces": ["default", "ops"]},
        },
    )
    assert tenancy.granted(s.tenants, "ops") == ("http", "kubernetes", "python")
    assert tenancy.granted(s.tenants, "acme") == ("http", "python")
