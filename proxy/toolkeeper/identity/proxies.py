"""Which peers may say who a request is for in a header: the front proxies the operator names, loopback by default.

A header like `X-Forwarded-User` is only as true as whoever set it: a front
proxy that authenticates people sets it, and anyone who reaches toolkeeper
directly could set it too. So it is believed only from a trusted peer, and a
request that carries it from any other peer is refused, never served as if the
header were not there (that would let a forged name pass unnoticed in logs).
"""

from __future__ import annotations

import ipaddress

LOOPBACK = ("127.0.0.0/8", "::1/128")


class TrustedProxies:
    def __init__(self, networks: tuple[str, ...] = ()):
        try:
            self.networks = tuple(ipaddress.ip_network(text.strip(), strict=False) for text in networks or LOOPBACK)
        except ValueError as exc:
            raise ValueError(f"--trusted-proxy: {exc}") from None

    def believes(self, peer: str | None) -> bool:
        if not peer:
            return False  # a Unix socket or an unknown peer: no address to trust
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)
