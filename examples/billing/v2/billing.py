"""Billing, release 2.0: invoices in cents, sent to the customer's e-mail address as it is
when the invoice goes out (a Fresh field), not as it was when the invoice was scheduled.

Payload version 2 of send-invoice; version 1 payloads (dollars) are still read, through
the upcaster below, so jobs queued by release 1.0 run here unchanged. Release 1.0's
workers cannot read version 2: a job of it that only they could pick up is parked, and
runs as soon as a worker of this release registers.

    corral worker billing:app

$BILLING_CUSTOMERS is a JSON file of customers by id ({"7": {"email": ...}}): the
source the Fresh field is read from at run time.
"""

from __future__ import annotations

import json
import os
import time
from typing import Literal

from pydantic import BaseModel

import corral
from corral import Stopped
from corral.worker import Fresh, Pinned, current_task

app = corral.App("billing", version="2.0.0")


class InvoiceV1(BaseModel):
    customer_id: Pinned[int]
    amount: Pinned[float]  # dollars


class Invoice(BaseModel):
    customer_id: Pinned[int]
    amount_cents: Pinned[int]  # what was agreed when the invoice was made
    email: Fresh[str | None] = None  # where it goes: read when it is sent


@app.task("send-invoice", version=2)
def send_invoice(invoice: Invoice) -> None:
    _append(
        "BILLING_OUTBOX",
        {
            "customer": invoice.customer_id,
            "cents": invoice.amount_cents,
            "email": invoice.email,
            "by": app.version,
        },
    )


@send_invoice.upcaster(from_version=1)
def dollars_to_cents(old: InvoiceV1) -> Invoice:
    return Invoice(customer_id=old.customer_id, amount_cents=round(old.amount * 100))


@send_invoice.resolver("email")
def email_of(invoice: Invoice) -> str | None:
    with open(os.environ["BILLING_CUSTOMERS"], encoding="utf-8") as f:
        customers = json.load(f)
    found = customers.get(str(invoice.customer_id), {})
    email = found.get("email")
    return email if isinstance(email, str) else None


class ReportV1(BaseModel):
    name: Pinned[str]
    pages: Pinned[int]
    seconds_a_page: Pinned[float] = 0.2


class Report(BaseModel):  # version 2: a format, which release 1.0 does not know
    name: Pinned[str]
    pages: Pinned[int]
    format: Pinned[Literal["csv", "pdf"]] = "csv"
    seconds_a_page: Pinned[float] = 0.2


@app.task("export-report", version=2)
def export_report(report: Report) -> None:
    """As in release 1.0, in a format: resumes from its checkpoint."""
    ctx = current_task()
    done = ctx.load_checkpoint(default={"page": 0})["page"]
    for page in range(done, report.pages):
        if ctx.stopping.is_set():
            ctx.save_checkpoint({"page": page})
            raise Stopped
        time.sleep(report.seconds_a_page)
        line = {"report": report.name, "page": page, "format": report.format, "fence": ctx.fence}
        _append("BILLING_REPORTS", line)
        ctx.save_checkpoint({"page": page + 1})


@export_report.upcaster(from_version=1)
def in_csv(old: ReportV1) -> Report:
    return Report(name=old.name, pages=old.pages, seconds_a_page=old.seconds_a_page)


def _append(variable: str, line: dict[str, object]) -> None:
    with open(os.environ[variable], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
