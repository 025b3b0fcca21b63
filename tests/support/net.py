"""Who listens on a TCP port, from /proc/net/tcp and /proc/net/tcp6 (no tool to install)."""

from __future__ import annotations

import ipaddress

LISTEN = "0A"
"""The TCP state of a listening socket in /proc/net/tcp."""


def listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on TCP `port`: "127.0.0.1", "::1", "0.0.0.0", "::"."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.append(_address(address))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    data = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(data))
