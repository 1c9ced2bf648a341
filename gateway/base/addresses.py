"""Which network addresses a connection the gateway opens on someone else's word may reach.

A media URL in a request (``server/fetch.py``) and a redirect from a model hub or registry
(``hub/transfer.py``) both name a host the gateway then connects to from inside the operator's
network; neither may lead it into the loopback or private ranges unless the operator allowed it.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 prefixes that carry an IPv4 address in their last 32 bits: RFC 6052's NAT64 prefix
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def forbidden(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address a fetch must not reach: anything not publicly routable,
    judged on the IPv4 address an IPv6 one embeds where it embeds one."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return forbidden(embedded)
    return (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast
            or ip.is_unspecified or ip.is_reserved or not ip.is_global)


def forbidden_text(host: str) -> bool:
    """``forbidden`` for an address written as text; anything that is not an address is refused
    rather than guessed at."""
    try:
        return forbidden(ipaddress.ip_address(host))
    except ValueError:
        return True


def is_loopback(host: str) -> bool:
    """Whether a host to bind or a Host header names this machine only: ``localhost`` (and its
    subdomains) or a loopback address."""
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
