"""Billing, release 1.0: invoices in dollars, and a long report export that checkpoints.

Run a worker of it from this folder:

    corral worker billing:app

Each invoice sent is appended as one JSON line to the file $BILLING_OUTBOX (a stand-in
for the mail server); a report's pages to $BILLING_REPORTS.
"""

from __future__ import annotations

import json
import os
import time

from pydantic import BaseModel

import corral
from corral import Stopped
from corral.worker import Pinned, current_task

app = corral.App("billing", version="1.0.0")


class Invoice(BaseModel):
    customer_id: Pinned[int]
    amount: Pinned[float]  # dollars


@app.task("send-invoice", version=1)
def send_invoice(invoice: Invoice) -> None:
    _append(
        "BILLING_OUTBOX",
        {"customer": invoice.customer_id, "cents": round(invoice.amount * 100), "by": app.version},
    )


class Report(BaseModel):
    name: Pinned[str]
    pages: Pinned[int]
    seconds_a_page: Pinned[float] = 0.2


@app.task("export-report", version=1)
def export_report(report: Report) -> None:
    """Writes its pages one by one, saving how far it got; told to stop, it saves and
    stops, and the worker that picks the job up next goes on from there."""
    ctx = current_task()
    done = ctx.load_checkpoint(default={"page": 0})["page"]
    for page in range(done, report.pages):
        if ctx.stopping.is_set():
            ctx.save_checkpoint({"page": page})
            raise Stopped
        time.sleep(report.seconds_a_page)
        _append("BILLING_REPORTS", {"report": report.name, "page": page, "fence": ctx.fence})
        ctx.save_checkpoint({"page": page + 1})


def _append(variable: str, line: dict[str, object]) -> None:
    with open(os.environ[variable], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
