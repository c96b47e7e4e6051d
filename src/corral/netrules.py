"""`executors.http.allow_networks`: the non-public addresses and ports HTTP jobs (and alert
channels) may reach.

An entry is `ADDRESS[/PREFIX][:PORT[-PORT]]`, an IPv6 one in brackets when it names ports
(`[::1]:8080`, `[fd00::/8]:443`). A network without ports opens ports 80 and 443 only: a
local receiver does not also open the database beside it (`127.0.0.0/8` used to open
PostgreSQL's 5432 too). Ports restrict only the networks the list opens: a public address
is reachable on any port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

WEB_PORTS = ((80, 80), (443, 443))
"""What a network named without ports opens."""


@dataclass(frozen=True, slots=True)
class Opening:
    """One entry: a network, and the port ranges it opens there."""

    network: Network
    ports: tuple[tuple[int, int], ...]

    def opens(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> bool:
        return ip in self.network and any(lo <= port <= hi for lo, hi in self.ports)

    def __str__(self) -> str:
        ports = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ports)
        return f"{self.network} (ports {ports})"


def parse(entry: str) -> Opening:
    """An entry as an Opening; ValueError naming the rule."""
    rule = (
        f"{entry!r} is not ADDRESS[/PREFIX][:PORT[-PORT]], e.g. 10.0.0.0/8, 127.0.0.1:8080,"
        " 127.0.0.0/8:8000-8099 or [::1]:8080 (IPv6 in brackets when it names ports)"
    )
    address, ports, named = entry.strip(), "", False
    if address.startswith("["):
        inside, bracket, after = address[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise ValueError(rule)
        address, ports, named = inside, after[1:], bool(after)
    elif address.count(":") == 1:  # IPv4 with a port; bare IPv6 has two or more
        address, _, ports = address.partition(":")
        named = True
    try:
        network = ipaddress.ip_network(address, strict=False)
    except ValueError:
        raise ValueError(rule) from None
    if not named:
        return Opening(network, WEB_PORTS)
    lo_text, dash, hi_text = ports.partition("-")
    if not (lo_text.isascii() and lo_text.isdigit()) or (
        dash and not (hi_text.isascii() and hi_text.isdigit())
    ):
        raise ValueError(rule)
    lo, hi = int(lo_text), int(hi_text) if dash else int(lo_text)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{entry!r}: ports must be 1-65535, the first no higher than the last")
    return Opening(network, ((lo, hi),))
