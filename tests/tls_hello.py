"""Hand-built TLS ClientHello records for tests of code that reads the server name before any TLS library does."""

from __future__ import annotations


def record_with_name(name: bytes) -> bytes:
    """A minimal ClientHello in one record asking for ``name``."""
    entry = b"\x00" + len(name).to_bytes(2, "big") + name
    value = len(entry).to_bytes(2, "big") + entry
    extensions = b"\x00\x00" + len(value).to_bytes(2, "big") + value
    body = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += len(extensions).to_bytes(2, "big") + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake
