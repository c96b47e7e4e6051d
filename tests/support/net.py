"""Loopback ports for tests that start servers, or need an address nothing answers on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on (bound, then let go): connecting to it is refused
    until something listens there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
