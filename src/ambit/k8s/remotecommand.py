"""Kubernetes' remote command protocol over WebSocket (``v4`` and ``v5.channel.k8s.io``), sans-IO.

Theory of operation. ``kubectl exec`` opens a WebSocket to ``pods/<name>/exec?command=...`` offering the
subprotocols of :data:`PROTOCOLS`; the server picks the first it speaks. Every message is binary: its first byte
names the channel, the rest is that channel's bytes. The API server relays messages unchanged between kubectl and
the node's kubelet, which runs the command.

Rules:
1. Channels: 0 stdin (client → server), 1 stdout, 2 stderr, 3 error (server → client), 4 resize (client → server,
   JSON ``{"Width", "Height"}``; we run commands without a terminal and ignore it), 255 close (v5 only: the payload
   is one byte naming the channel the sender will write no more to; kubectl half-closes stdin with it).
2. An empty message carries no channel and is ignored (some kubectl versions send one per stream at the start);
   a message naming an unknown channel is ignored too, so a newer peer's extensions cannot break a relay.
3. The error channel carries one ``Status`` JSON document, once, at the end: ``Success``, or ``Failure`` with reason
   ``NonZeroExitCode`` and a cause ``{"reason": "ExitCode", "message": "<code>"}`` from which kubectl takes its own
   exit code. After it the server closes the WebSocket.
4. Under a tty request the command's stderr is merged into stdout (kube runs it on a terminal that has one output),
   so no stderr channel is used.
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
        values = get_all.get(name) or ()
        text = values[-1] if values else ""
        if text in ("", "false", "0", "False"):
            return False
        if text in ("true", "1", "True"):
            return True
        raise ExecOptionsError(f"{name} must be true or false, not {text!r}")

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
