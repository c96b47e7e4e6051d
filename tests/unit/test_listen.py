"""The API's listening socket: answers on a kept-alive connection are sent at once."""

from __future__ import annotations

import socket

from corral.api import server


def test_accepted_connections_send_small_answers_at_once() -> None:
    """TCP_NODELAY on every accepted connection (inherited from the listener): asyncio sets
    it only on sockets made with proto IPPROTO_TCP, and without it each answer after the
    first on a connection waits for the client's delayed ACK (about 40 ms)."""
    listening = server.listen("127.0.0.1:0")
    try:
        with socket.create_connection(listening.getsockname()[:2], timeout=30):
            accepted, _ = listening.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        listening.close()
