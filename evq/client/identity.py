"""Client ids: unique per process by default, so two processes on one host can never share an
id and shadow each other's queues in a rebalance (seed 003)."""

from __future__ import annotations

import os
import secrets
import socket


def local_ip() -> str:
    """The address other hosts would see; loopback when the host has no route out."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent for a UDP connect
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def new_client_id(instance: str | None = None) -> str:
    """``ip@instance``, the instance defaulting to ``pid#random`` (Java uses the pid alone)."""
    return f"{local_ip()}@{instance or f'{os.getpid()}#{secrets.token_hex(4)}'}"
