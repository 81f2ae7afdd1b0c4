"""Asking the lab's supervisor for a hand-over: ``ambit lab restart nodeproxy`` (rule 5 of
:mod:`ambit.lab.cluster.supervisor`).

Theory of operation: the supervisor listens on a unix socket in the lab's directory (``mesh/supervisor.sock``,
mode 0600: only the lab's owner, root, may restart its daemons). A request is one line, ``handover <daemon>``
(``handover nodeproxy node-1``); the answer is one line, ``ok <what happened>`` or ``error <why>``, written once the
hand-over is over (the new process ready, the old one told to drain) or failed. One request per connection.
:func:`parse_request` is pure and bounded: a request longer than ``MAX_REQUEST`` or not of that form is answered
``error`` with the reason, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ambit.errors import AmbitError

log = logging.getLogger("ambit.lab.cluster.handover")

SOCKET_NAME = "supervisor.sock"
"""Under ``<lab dir>/mesh/``."""
MAX_REQUEST = 256
READ_TIMEOUT = 5.0
"""Seconds a client has to send its request line."""
ANSWER_TIMEOUT = 180.0
"""Seconds a client waits for the answer (the new process's start-up, bounded by the supervisor's own limit)."""


class HandOverError(AmbitError):
    """A hand-over request that is malformed, was refused, or could not be delivered."""


@dataclass(frozen=True, slots=True)
class HandOverRequest:
    what: str
    """The daemon as the supervisor names it: ``nodeproxy node-1``."""


def parse_request(line: bytes) -> HandOverRequest:
    """The request in ``line`` (without its newline), or :class:`HandOverError` saying what is wrong."""
    if len(line) > MAX_REQUEST:
        raise HandOverError(f"request longer than {MAX_REQUEST} bytes")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise HandOverError("request is not ASCII") from None
    verb, _, what = text.strip().partition(" ")
    if verb != "handover":
        raise HandOverError(f"unknown request {verb!r} (expected: handover <daemon>)")
    what = " ".join(what.split())
    if not what or not all(c.isalnum() or c in " -._" for c in what):
        raise HandOverError(f"bad daemon name {what!r}")
    return HandOverRequest(what)


def socket_path(lab_dir: Path) -> Path:
    return lab_dir / "mesh" / SOCKET_NAME


class HandOverServer:
    """The supervisor's end: serves requests with ``hand_over(what) -> message`` until :meth:`aclose`."""

    def __init__(self, path: Path, hand_over: Callable[[str], Awaitable[str]]) -> None:
        self.path = path
        self._hand_over = hand_over
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    line = await reader.readuntil(b"\n")
                request = parse_request(line.rstrip(b"\n"))
                answer = "ok " + await self._hand_over(request.what)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                answer = "error no request line"
            except AmbitError as exc:
                answer = f"error {exc}"
            log.info("hand-over request: %s", answer)
            writer.write(answer.replace("\n", " ").encode() + b"\n")
            await writer.drain()
        except OSError:
            pass  # the client went away; the hand-over itself went on
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.path.unlink(missing_ok=True)


def request_hand_over(lab_dir: Path, what: str, timeout: float = ANSWER_TIMEOUT) -> str:
    """Ask the lab's supervisor to hand ``what`` over; its one-line answer, or :class:`HandOverError`."""
    path = socket_path(lab_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(f"handover {what}\n".encode())
            answer = b""
            while not answer.endswith(b"\n") and len(answer) <= 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except (FileNotFoundError, ConnectionRefusedError):
            raise HandOverError(f"no supervisor listening on {path} (is the lab up with --supervised?)") from None
        except TimeoutError:
            raise HandOverError(f"no answer from the supervisor within {timeout:g} s") from None
        except OSError as exc:
            raise HandOverError(f"cannot ask the supervisor at {path}: {exc}") from None
    text = answer.decode("utf-8", "replace").strip()
    status, _, message = text.partition(" ")
    if status != "ok":
        raise HandOverError(message or "the supervisor closed the connection without an answer")
    return message
