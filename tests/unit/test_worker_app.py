"""corral.App: tasks with payload versions, upcaster chains, pinned and fresh fields, and
the errors a person gets for a task that cannot run."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from corral import errors, python_tasks
from corral.worker import App, Fresh, Pinned
from corral.worker.app import fresh_fields, load_app, pinned_fields


class V1(BaseModel):
    amount: Pinned[float]


class V2(BaseModel):
    amount_cents: Pinned[int]


class V3(BaseModel):
    amount_cents: Pinned[int]
    currency: Pinned[str] = "EUR"
    email: Fresh[str | None] = None


def three_versions() -> App:
    app = App("billing", version="3.1.0")

    @app.task("invoice", version=3)
    def invoice(data: V3) -> None: ...

    @invoice.upcaster(from_version=2)
    def add_currency(old: V2) -> V3:
        return V3(amount_cents=old.amount_cents)

    @invoice.upcaster(from_version=1)
    def to_cents(old: V1) -> dict[str, int]:
        return {"amount_cents": round(old.amount * 100)}

    @invoice.resolver("email")
    def email(data: V3) -> str:
        return "x@example.com"

    return app


def test_a_task_reads_every_version_its_upcasters_lead_up_from() -> None:
    task = three_versions().get("invoice")
    assert task.reads() == [1, 2, 3]
    assert task.read(1, {"amount": 12.5}) == V3(amount_cents=1250)
    assert task.read(3, {"amount_cents": 5, "currency": "USD"}).currency == "USD"
    assert task.schema(1)["properties"] == {"amount": {"title": "Amount", "type": "number"}}
    reads = three_versions().reads()
    assert [(r.task, r.version, r.newest) for r in reads] == [
        ("invoice", 1, False),
        ("invoice", 2, False),
        ("invoice", 3, True),
    ]


def test_a_payload_that_does_not_fit_names_the_field_and_the_version() -> None:
    task = three_versions().get("invoice")
    with pytest.raises(errors.InvalidInput, match=r"invoice version 1: data.amount: Input"):
        task.read(1, {"amount": "lots"})
    with pytest.raises(errors.InvalidInput, match="version 4 is not one this worker reads"):
        task.read(4, {})
    assert task.payload(V3(amount_cents=1)) == python_tasks.envelope(
        "invoice", 3, {"amount_cents": 1, "currency": "EUR", "email": None}
    )


def test_a_gap_in_the_upcasters_ends_what_a_task_reads() -> None:
    app = App("a")

    @app.task("t", version=3)
    def t(data: V3) -> None: ...

    @t.upcaster(from_version=1)
    def one(old: V1) -> V2:
        return V2(amount_cents=0)

    @t.resolver("email")
    def email(data: V3) -> None:
        return None

    assert t.reads() == [3]  # no upcaster from 2: version 1 cannot reach 3


def test_fields_are_pinned_unless_marked_fresh() -> None:
    assert fresh_fields(V3) == ["email"]
    assert pinned_fields(V3) == ["amount_cents", "currency"]


def test_what_cannot_run_is_refused_when_the_app_is_read() -> None:
    app = App("a")

    @app.task("t", version=2)
    def t(data: V3) -> None: ...

    with pytest.raises(errors.ConfigError, match=r"Fresh field\(s\) email have no resolver"):
        app.check()
    with pytest.raises(errors.ConfigError, match="has no Fresh field of that name"):
        t.resolver("currency")(lambda d: "x")
    with pytest.raises(errors.ConfigError, match="from_version=2: must be at least 1 and below"):
        t.upcaster(from_version=2)(lambda d: d)
    with pytest.raises(errors.ConfigError, match="declared twice"):
        app.task("t")(lambda d: None)
    with pytest.raises(errors.ConfigError, match="give its payload model"):
        app.task("u")(lambda d: None)
    with pytest.raises(errors.ConfigError, match="give MODULE:APP"):
        load_app("billing")
    with pytest.raises(errors.ConfigError, match="cannot import"):
        load_app("no_such_module_here:app")
    with pytest.raises(errors.ConfigError, match="not a corral.App"):
        load_app("corral.model:PYTHON")


def test_app_versions_sort_as_people_read_them() -> None:
    ordered = ["0.9", "1.2.0", "1.10.0", "2.0.0-rc1", "2.0.0", "abc123", "abc124"]
    assert sorted(reversed(ordered), key=python_tasks.version_key) == ordered
