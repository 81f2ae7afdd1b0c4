"""What a DestinationRule adds to a connection the waypoint opens to an endpoint: a PROXY header, then TLS.

Theory of operation: :meth:`ambit.waypoint.upstream.Upstreams.open_stream` opens the byte stream (an HBONE tunnel
or plain TCP) and, for a :class:`~ambit.waypoint.destinations.Transport` that asks, writes :func:`proxy_header`
first (Envoy's PROXY transport socket wraps the TLS one, so the header travels in the clear before the handshake),
then wraps the stream in :class:`TlsStream`: TLS over any :class:`~ambit.proxy.streams.ByteStream` through
:class:`ssl.SSLObject` and memory BIOs, since the stream may be an HTTP/2 CONNECT tunnel rather than a socket.

Rules:

1. :func:`client_context` builds the context for one :class:`~ambit.model.destination_policy.ClientTls`: TLS 1.2 or
   later; ``insecure_skip_verify`` verifies nothing; else the chain is verified against ``ca_certificates`` (PEM) or
   the system store, and the name against ``subject_alt_names`` when given (checked after the handshake), else
   against the SNI. ALPN ``h2`` when the requests go as HTTP/2, ``http/1.1`` otherwise. Trust anchors from a
   file when ``ca_certificates_path`` is given instead (rule 6).
2. A handshake that fails or takes longer than the connect timeout is an upstream connect failure; the stream
   under it is aborted.
3. :class:`TlsStream` writes go out in order (one lock around moving bytes from the BIO to the stream); a read
   returns decrypted bytes, ``b""`` at the peer's close_notify or at the stream's end.
4. A PROXY v1 header names TCP4 or TCP6 and both addresses; families that differ (or an address that is not an IP)
   give ``PROXY UNKNOWN``. v2 is the binary form (command PROXY, or LOCAL with no addresses for the same case).
5. MUTUAL presents a client certificate: the PEM chain and key the control plane sent (a Secret's), else the
   files named by ``client_certificate_path`` and ``private_key_path``; neither, or any that fails to load, or a
   key that does not match the certificate, fails the context (rule 2's connect failure, a 503: fail closed).
6. Files (``*_path``) are read when the context is built, which is once per distinct setting: an absolute path to a
   regular file (no FIFO, device or directory) of at most :data:`MAX_PEM_FILE` bytes holding PEM. Errors name the
   path and the reason, never the contents.
7. Settings marked ``trust_unresolved`` (a ``credentialName`` the control plane could not resolve) fail the
   context: rule 2's connect failure, a 503, never a fallback to the system store.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import stat

from ambit import proxyprotocol
from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import parse_authority
from ambit.model.destination_policy import ClientTls, ProxyProtocolVersion, TlsMode
from ambit.model.workload import IPAddress
from ambit.proxy.streams import ByteStream

READ_SIZE = 256 * 1024
MAX_PEM_FILE = 1024 * 1024


class TlsOriginationError(Exception):
    """The TLS handshake with the endpoint failed, or its certificate does not name the expected server."""


def client_context(tls: ClientTls, *, h2: bool) -> ssl.SSLContext:
    """Rule 1. Raises :class:`TlsOriginationError` for trust anchors that do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"] if h2 else ["http/1.1"])
    if tls.mode is TlsMode.MUTUAL:
        _client_certificate(context, tls)
    if tls.trust_unresolved:
        raise TlsOriginationError("the credentialName's trust anchors were not found: the endpoint is refused")
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        if tls.ca_certificates:
            context.load_verify_locations(cadata=tls.ca_certificates)
        elif tls.ca_certificates_path:
            context.load_verify_locations(cadata=read_pem_file(tls.ca_certificates_path).decode("ascii"))
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
        raise TlsOriginationError(f"the DestinationRule's CA certificates do not load: {_reason(exc)}") from None
    context.check_hostname = not tls.subject_alt_names
    return context


def _client_certificate(context: ssl.SSLContext, tls: ClientTls) -> None:
    """Rule 5."""
    if tls.client_certificate and tls.private_key:
        chain, key = tls.client_certificate.encode(), tls.private_key.encode()
    elif tls.client_certificate_path and tls.private_key_path:
        chain, key = read_pem_file(tls.client_certificate_path), read_pem_file(tls.private_key_path)
    else:
        raise TlsOriginationError("tls mode MUTUAL without a client certificate and key")
    # The stdlib loads a key pair only from a file: an anonymous memory file holds it for the call, never a disk.
    fd = os.memfd_create("ambit-client-certificate", os.MFD_CLOEXEC)
    try:
        pem = chain + b"\n" + key + b"\n"
        while pem:
            pem = pem[os.write(fd, pem) :]
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    except (ssl.SSLError, OSError) as exc:
        raise TlsOriginationError(f"the client certificate and key do not load: {_reason(exc)}") from None
    finally:
        os.close(fd)


def read_pem_file(path: str) -> bytes:
    """Rule 6: a regular file of at most :data:`MAX_PEM_FILE` bytes at an absolute path; its contents."""
    if not path.startswith("/"):
        raise TlsOriginationError(f"{path!r} is not an absolute path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise TlsOriginationError(f"{path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TlsOriginationError(f"{path}: not a regular file")
        if info.st_size > MAX_PEM_FILE:
            raise TlsOriginationError(f"{path}: larger than {MAX_PEM_FILE} bytes")
        data = os.read(fd, MAX_PEM_FILE + 1)
    except OSError as exc:
        raise TlsOriginationError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_PEM_FILE or b"-----BEGIN " not in data:
        raise TlsOriginationError(f"{path}: not a PEM file")
    return data


def _reason(exc: Exception) -> str:
    """An error's reason without the data that caused it (a key is never quoted)."""
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.library or "TLS library error")
    if isinstance(exc, OSError):
        return str(exc.strerror or type(exc).__name__)
    return type(exc).__name__


def _names_match(pattern: str, name: str) -> bool:
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


class TlsStream:
    """TLS over a :class:`~ambit.proxy.streams.ByteStream` (rule 3)."""

    def __init__(self, inner: ByteStream, context: ssl.SSLContext, server_hostname: str) -> None:
        self.inner = inner
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_hostname=server_hostname or None)
        self._lock = asyncio.Lock()
        self._eof = False

    @property
    def alpn(self) -> str | None:
        return self._tls.selected_alpn_protocol()

    async def handshake(self, subject_alt_names: tuple[str, ...] = ()) -> None:
        """Rule 1 and 2 (the caller bounds the time)."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise TlsOriginationError("the endpoint closed the connection during the TLS handshake") from None
            except ssl.SSLCertVerificationError as exc:
                raise TlsOriginationError(f"the endpoint's certificate is not trusted: {exc.verify_message}") from None
            except ssl.SSLError as exc:
                raise TlsOriginationError(f"TLS handshake failed: {exc.reason or exc}") from None
        await self._flush()
        if subject_alt_names:
            cert = self._tls.getpeercert() or {}
            names = [str(entry[1]) for entry in cert.get("subjectAltName", ()) if entry[0] == "DNS"]
            if not any(_names_match(p, n) for p in subject_alt_names for n in names):
                raise TlsOriginationError(f"the endpoint's certificate names none of {', '.join(subject_alt_names)}")

    async def _flush(self) -> None:
        async with self._lock:
            data = self._out.read()
            if data:
                await self.inner.write(data)

    async def _fill(self) -> bool:
        data = await self.inner.read()
        if not data:
            self._in.write_eof()
            return False
        self._in.write(data)
        return True

    async def read(self) -> bytes:
        while not self._eof:
            try:
                data = self._tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                await self._flush()  # a post-handshake message may want an answer
                if not await self._fill():
                    self._eof = True
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                break
            except ssl.SSLError as exc:
                raise OSError(f"TLS error from the endpoint: {exc.reason or exc}") from None
            if data:
                await self._flush()
                return data
            self._eof = True
        return b""

    async def write(self, data: bytes | memoryview) -> None:
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            raise OSError(f"TLS error towards the endpoint: {exc.reason or exc}") from None
        await self._flush()

    def write_eof(self) -> None:
        self.inner.write_eof()  # TLS has no half-close; the stream's end tells the endpoint

    def abort(self) -> None:
        self.inner.abort()

    async def aclose(self) -> None:
        await self.inner.aclose()


def proxy_header(version: ProxyProtocolVersion, source: str, destination: str) -> bytes:
    """Rule 4; ``source`` and ``destination`` are ``ip:port`` (``[v6]:port``)."""
    src: tuple[IPAddress, int] | None = None
    dst: tuple[IPAddress, int] | None = None
    try:
        src_host, src_port = parse_authority(source)
        dst_host, dst_port = parse_authority(destination)
        src = (ipaddress.ip_address(src_host), src_port)
        dst = (ipaddress.ip_address(dst_host), dst_port)
    except (AuthorityError, ValueError):
        src = dst = None
    if version is ProxyProtocolVersion.V1:
        return proxyprotocol.encode_v1(src, dst)
    if src is None or dst is None or src[0].version != dst[0].version:
        return proxyprotocol.encode_v2_local()
    return proxyprotocol.encode_v2(src, dst)
