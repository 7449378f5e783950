"""Which address a process of the rl job listens on for a peer on another node: the rollout server for its
trainer rank (rollout/protocol.py) and trainer rank 0's store for the weight group (weights/broadcast.py)."""

from __future__ import annotations

import ipaddress
import socket

from gdnctl.errors import GdnctlError

LOOPBACK = "127.0.0.1"


class UnresolvableHost(GdnctlError):
    """This node's own name does not resolve, so a peer on another node cannot reach it by that name."""

    exit_code = 1


def remote_bind_address(host: str) -> str:
    """The address to listen on for a trainer on another node, which connects to this node's name `host` (what
    the address file carries): the interface that name resolves to."""
    try:
        address = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror:
        raise UnresolvableHost(
            f"this node's name {host} does not resolve, so the trainer cannot reach the rollout "
            "server by it; add the name to DNS or /etc/hosts, or set rollout.colocate: true."
        ) from None
    # A name that resolves to loopback here (Debian's `127.0.1.1 <name>` line in /etc/hosts) resolves to the
    # node's real address on the trainer's node, which this node cannot tell: every interface is the one that
    # surely includes it (the authkey still guards the port).
    return "0.0.0.0" if ipaddress.ip_address(address).is_loopback else address
