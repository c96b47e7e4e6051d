"""The client's address behind trusted proxies only."""

from __future__ import annotations

import ipaddress

import pytest

from corral import proxies

TRUSTED = [ipaddress.ip_network("10.0.0.0/24"), ipaddress.ip_network("fd00::/8")]


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("198.51.100.1", ["1.2.3.4"], "198.51.100.1"),  # an untrusted peer: its own address
        ("10.0.0.5", ["1.2.3.4"], "1.2.3.4"),
        ("10.0.0.5", ["6.6.6.6, 1.2.3.4"], "1.2.3.4"),  # the left one is the asker's to write
        ("10.0.0.5", ["1.2.3.4, 10.0.0.9"], "1.2.3.4"),  # through two proxies
        ("10.0.0.5", ["6.6.6.6", "1.2.3.4"], "1.2.3.4"),  # two headers, in order
        ("10.0.0.5", [], "10.0.0.5"),
        ("fd00::1", ["2001:db8::7"], "2001:db8::7"),
    ],
)
def test_the_client_is_the_rightmost_untrusted_hop(
    peer: str, forwarded: list[str], client: str
) -> None:
    assert proxies.client_address(peer, forwarded, TRUSTED) == client


def test_a_proxy_that_is_no_address_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="not an address or network"):
        proxies.ApiSettings(trusted_proxies=("proxy.internal",))
