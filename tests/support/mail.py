"""A real SMTP server (aiosmtpd) on a free port of 127.0.0.1, and what it received: the
`smtp` fixture, for tests of alerts sent by e-mail."""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.support.net import free_port


class Inbox:
    """What the SMTP server received."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(parsed)  # type: ignore[arg-type]
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    """The server's inbox and port, for as long as the test runs."""
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()
