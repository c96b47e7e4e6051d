"""The `http` executor's guard against server-side request forgery: which addresses and
ports a request may go to (global addresses, and those executors.http.allow_networks
opens), and the one address a host name is connected to, every answer of its single
lookup checked. errors.DestinationRefused is its refusal.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpx

from corral import errors, netrules

_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT: not global, yet not `is_private`


class Guard:
    """Which addresses and ports a request may go to: global addresses on any port, and
    those of `allow` (corral.netrules) on purpose."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allow = tuple(netrules.parse(entry) for entry in allow)

    def refusal(self, address: str, port: int) -> str | None:
        """Why a request must not go to `address` on `port`, or None."""
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        elif isinstance(ip, ipaddress.IPv6Address):
            # An IPv4 address carried in an IPv6 one is reached through it: 2002:a9fe:a9fe::
            # (6to4), 2001:0:... (Teredo: its client).
            inner = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
            if inner is not None and not any(o.opens(ip, port) for o in self.allow):
                why = self.refusal(str(inner), port)
                return None if why is None else f"{address} holds {why}"
        if any(o.opens(ip, port) for o in self.allow):
            return None
        if nearly := [str(o) for o in self.allow if ip in o.network]:
            return (
                f"{address} port {port} is not opened: executors.http.allow_networks opens"
                f" {', '.join(nearly)}; name the port there (e.g. {ip}:{port})"
            )
        for kind, hit in (
            ("unspecified", ip.is_unspecified),
            ("loopback", ip.is_loopback),
            ("link-local", ip.is_link_local),
            ("multicast", ip.is_multicast),
            ("shared (CGNAT)", ip in _SHARED),
            ("reserved", ip.is_reserved),
            ("private", ip.is_private),
            ("non-public", not ip.is_global),
        ):
            if hit:
                return f"{address} is a {kind} address (executors.http.allow_networks opens it)"
        return None

    async def address(self, host: str, port: int) -> str:
        """The one address to connect to for `host`: resolved once, every answer checked."""
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for found in addresses:
            if why := self.refusal(found, port):
                raise errors.DestinationRefused(f"{host}: {why}" if found != host else why)
        return addresses[0]
