"""Kubernetes' remote command protocol over WebSocket (``v4`` and ``v5.channel.k8s.io``), sans-IO.

Theory of operation. ``kubectl exec`` opens a WebSocket to ``pods/<name>/exec?command=...`` offering the
subprotocols of :data:`PROTOCOLS`; the server picks the first it speaks. Every message is binary: its first byte
names the channel, the rest is that channel's bytes. The API server relays messages unchanged between kubectl and
the node's kubelet, which runs the command.

Rules:
1. Channels: 0 stdin (client → server), 1 stdout, 2 stderr, 3 error (server → client), 4 resize (client → server,
   JSON ``{"Width", "Height"}``: rule 5), 255 close (v5 only: the payload is one byte naming the channel the sender
   will write no more to; kubectl half-closes stdin with it).
2. An empty message carries no channel and is ignored (some kubectl versions send one per stream at the start);
   a message naming an unknown channel is ignored too, so a newer peer's extensions cannot break a relay.
3. The error channel carries one ``Status`` JSON document, once, at the end: ``Success``, or ``Failure`` with reason
   ``NonZeroExitCode`` and a cause ``{"reason": "ExitCode", "message": "<code>"}`` from which kubectl takes its own
   exit code. After it the server closes the WebSocket.
4. Under a tty request the command's stderr is merged into stdout (kube runs it on a terminal that has one output),
   so no stderr channel is used.
5. A resize message (:func:`parse_resize`) is one JSON object of at most :data:`MAX_RESIZE_MESSAGE` bytes whose
   ``Width`` and ``Height`` are integers from 0 to 65535 (a terminal's size is two unsigned 16-bit numbers); a
   field left out is 0, as Go's decoder leaves it; unknown fields are ignored. Anything else is a
   :class:`ResizeError` whose message says what was wrong in one line: the caller logs it and keeps the session.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
"""What we speak, preferred first (kubectl 1.32 offers both, v5 first)."""


class Channel(enum.IntEnum):
    STDIN = 0
    STDOUT = 1
    STDERR = 2
    ERROR = 3
    RESIZE = 4
    CLOSE = 255


@dataclass(frozen=True, slots=True)
class Frame:
    """One message: its channel and its payload."""

    channel: Channel
    data: bytes


def frame(channel: Channel, data: bytes) -> bytes:
    """The message carrying ``data`` on ``channel``."""
    return bytes((channel,)) + data


def parse_frame(message: bytes) -> Frame | None:
    """The frame a message carries; None for an empty message or an unknown channel (rule 2)."""
    if not message:
        return None
    try:
        channel = Channel(message[0])
    except ValueError:
        return None
    return Frame(channel, bytes(message[1:]))


def closes_stdin(f: Frame) -> bool:
    """Whether ``f`` is v5's half-close of stdin (rule 1)."""
    return f.channel is Channel.CLOSE and f.data[:1] == bytes((Channel.STDIN,))


def exit_status(code: int) -> dict[str, Any]:
    """The error channel's Status for a command that exited with ``code`` (rule 3)."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def failure_status(message: str) -> dict[str, Any]:
    """The error channel's Status for a command that could not be run at all."""
    return {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500}


def status_message(status: Mapping[str, Any]) -> bytes:
    """The error-channel message carrying ``status``."""
    return frame(Channel.ERROR, json.dumps(status, separators=(",", ":")).encode())


def exit_code_of(status: Mapping[str, Any]) -> int | None:
    """The exit code a Status reports, as kubectl reads it: 0 for Success, the ExitCode cause's number, or None."""
    if status.get("status") == "Success":
        return 0
    causes = (status.get("details") or {}).get("causes") or ()
    for cause in causes:
        if isinstance(cause, Mapping) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message")))
            except ValueError:
                return None
    return None


MAX_RESIZE_MESSAGE = 1024
"""Bound on a resize message (kubectl's are about 30 bytes)."""
MAX_TERMINAL_SIDE = 0xFFFF


class ResizeError(AmbitError):
    """A resize message that is not a terminal size (rule 5): the peer's fault."""


@dataclass(frozen=True, slots=True)
class TerminalSize:
    """A terminal's size in character cells."""

    width: int
    height: int


def parse_resize(data: bytes) -> TerminalSize:
    """Rule 5: the size a resize message asks for; raises :class:`ResizeError`."""
    if len(data) > MAX_RESIZE_MESSAGE:
        raise ResizeError(f"resize message of {len(data)} bytes is longer than {MAX_RESIZE_MESSAGE}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ResizeError("resize message is not JSON") from None
    if not isinstance(doc, dict):
        raise ResizeError(f"resize message is a JSON {type(doc).__name__}, not an object")
    sides: list[int] = []
    for key in ("Width", "Height"):
        value = doc.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResizeError(f"resize message's {key} must be an integer, not {_shown(value)}")
        if not 0 <= value <= MAX_TERMINAL_SIDE:
            raise ResizeError(f"resize message's {key} must be from 0 to {MAX_TERMINAL_SIDE}, not {_shown(value)}")
        sides.append(value)
    return TerminalSize(sides[0], sides[1])


def _shown(value: Any) -> str:
    """A value for an error line: JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class ExecOptionsError(AmbitError):
    """An exec request kube would refuse (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ExecOptions:
    """kube's PodExecOptions, as query parameters."""

    command: tuple[str, ...]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


MAX_COMMAND_BYTES = 256 * 1024
"""Bound on a command line's total size (a query string holds it; the exec() of a real one is bounded too)."""


def parse_exec_options(get_all: Mapping[str, Sequence[str]]) -> ExecOptions:
    """PodExecOptions from query parameters (each name to all its values); raises :class:`ExecOptionsError`."""

    def flag(name: str) -> bool:
        return _flag(get_all, name)

    command = tuple(get_all.get("command") or ())
    if not command:
        raise ExecOptionsError("you must specify at least 1 command")
    if sum(len(word) for word in command) > MAX_COMMAND_BYTES or any("\x00" in word for word in command):
        raise ExecOptionsError("the command is too long or contains a NUL character")
    stdin, stdout, stderr, tty = flag("stdin"), flag("stdout"), flag("stderr"), flag("tty")
    if not (stdin or stdout or stderr):
        raise ExecOptionsError("you must specify at least 1 of stdin, stdout, stderr")
    containers = get_all.get("container") or ()
    return ExecOptions(command, containers[-1] if containers else "", stdin, stdout, stderr and not tty, tty)


@dataclass(frozen=True, slots=True)
class AttachOptions:
    """kube's PodAttachOptions, as query parameters."""

    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def parse_attach_options(get_all: Mapping[str, Sequence[str]]) -> AttachOptions:
    """PodAttachOptions from query parameters; raises :class:`ExecOptionsError` (kube's 400s)."""
    stdin, stdout, stderr, tty = (_flag(get_all, name) for name in ("stdin", "stdout", "stderr", "tty"))
    if not (stdin or stdout or stderr):
        raise ExecOptionsError("you must specify at least 1 of stdin, stdout, stderr")
    containers = get_all.get("container") or ()
    return AttachOptions(containers[-1] if containers else "", stdin, stdout, stderr and not tty, tty)


def _flag(get_all: Mapping[str, Sequence[str]], name: str) -> bool:
    values = get_all.get(name) or ()
    text = values[-1] if values else ""
    if text in ("", "false", "0", "False"):
        return False
    if text in ("true", "1", "True"):
        return True
    raise ExecOptionsError(f"{name} must be true or false, not {text!r}")
