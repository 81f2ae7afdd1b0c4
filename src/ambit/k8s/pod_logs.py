"""kube's PodLogOptions as query parameters, and which bytes of a container's output file a request gets (pure).

Theory of operation. A container's output is one file of plain bytes, appended to, with no per-line times. The API
server checks a ``pods/log`` request's options with :func:`parse_log_options` (so hostile values are refused before
a kubelet sees them) and forwards them; the kubelet parses them again and asks :func:`plan_window` where to start and
how much to send.

Rules:
1. ``tailLines=N``: the last N lines (a final line without its newline counts); 0 gives nothing.
2. ``limitBytes=N``: at most N bytes in all, counted from the start of the window (after the tail), as kube does;
   a follow ends when the limit is reached.
3. ``sinceSeconds=S``: lines carry no times, so the file's modification time stands for all of them: a file not
   written in the last S seconds gives nothing (a follow still streams what comes next); otherwise all of it.
4. ``timestamps=true`` is refused with 400: no time was recorded per line, and a made-up one would mislead.
5. ``previous=true`` is refused with 400 as kube does for a container with no previous instance: the lab appends
   every run of a container to the same file and keeps no separate previous log.
6. Integers that do not parse are 400 (kube's query decoding); negative or zero values where kube requires a
   positive one are 422 (kube's validation of PodLogOptions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ambit.errors import AmbitError

MAX_INT = 2**63 - 1


class LogOptionsError(AmbitError):
    """A logs request kube would refuse; ``code`` is the HTTP status (400 or 422)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class LogOptions:
    container: str = ""
    follow: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_seconds: int | None = None
    timestamps: bool = False
    previous: bool = False


def _flag(query: Mapping[str, str], name: str) -> bool:
    text = query.get(name, "")
    if text in ("", "false", "0", "False"):
        return False
    if text in ("true", "1", "True"):
        return True
    raise LogOptionsError(400, f"{name} must be true or false, not {text[:64]!r}")


def _int(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise LogOptionsError(400, f"{name} must be an integer, not {text[:64]!r}") from None
    if not -MAX_INT <= value <= MAX_INT:
        raise LogOptionsError(400, f"{name} is out of range")
    return value


def parse_log_options(query: Mapping[str, str]) -> LogOptions:
    """The options of a logs request (rules 4 to 6); raises :class:`LogOptionsError`."""
    tail = _int(query, "tailLines")
    limit = _int(query, "limitBytes")
    since = _int(query, "sinceSeconds")
    if tail is not None and tail < 0:
        raise LogOptionsError(422, f"tailLines: Invalid value: {tail}: must be greater than or equal to 0")
    if limit is not None and limit < 1:
        raise LogOptionsError(422, f"limitBytes: Invalid value: {limit}: must be greater than 0")
    if since is not None and since < 1:
        raise LogOptionsError(422, f"sinceSeconds: Invalid value: {since}: must be greater than 0")
    if query.get("sinceTime"):
        if since is not None:
            raise LogOptionsError(
                422, "sinceTime: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
            )
        raise LogOptionsError(400, "sinceTime is not supported: this runtime records no per-line times")
    options = LogOptions(
        container=query.get("container", ""),
        follow=_flag(query, "follow"),
        tail_lines=tail,
        limit_bytes=limit,
        since_seconds=since,
        timestamps=_flag(query, "timestamps"),
        previous=_flag(query, "previous"),
    )
    if options.timestamps:
        raise LogOptionsError(400, "timestamps are not available: this runtime records no per-line times")
    return options


@dataclass(frozen=True, slots=True)
class LogWindow:
    """Where to start reading and how many bytes at most (None: no bound)."""

    start: int
    limit: int | None


def tail_start(data: bytes, lines: int) -> int:
    """The offset in ``data`` (a file's end) where its last ``lines`` lines begin (rule 1)."""
    if lines <= 0:
        return len(data)
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        found = data.rfind(b"\n", 0, end)
        if found < 0:
            return 0
        end = found
    return end + 1


def plan_window(options: LogOptions, size: int, tail: bytes, mtime: float, now: float) -> LogWindow:
    """The window of a file of ``size`` bytes whose last bytes are ``tail`` (enough of them to hold the lines
    asked for, or the whole file), modified at ``mtime`` (rules 1 to 3)."""
    start = 0
    if options.since_seconds is not None and mtime < now - options.since_seconds:
        start = size
    elif options.tail_lines is not None:
        offset = tail_start(tail, options.tail_lines)
        start = size - len(tail) + offset
    return LogWindow(start, options.limit_bytes)
