"""The kubelet's API for one lab node: container logs, exec, attach and port-forward, on a unix socket for the API
server.

Theory of operation. kube-apiserver reaches a node's kubelet for ``pods/log``, ``pods/exec`` and
``pods/portforward``; here the API server (a root process of the lab) connects to ``<node dir>/kubelet.sock``, which
only root may open. The server knows pods
through a :class:`PodTable` (the node runtime's own pods, by namespace and name: pods of other nodes are not found)
and runs commands through a :class:`ContainerExec` (``runc exec`` in the lab, a local process in tests).

Rules:
1. ``GET /containerLogs/{ns}/{pod}/{container}`` streams the container's output file as ``text/plain``, with the
   options of :mod:`ambit.k8s.pod_logs`. A follow keeps streaming appended bytes until the client goes, the limit
   is reached, or the container is no longer running (then what is left in the file is sent and the stream ends).
2. ``GET /exec/{ns}/{pod}/{container}?command=...`` upgrades to a WebSocket speaking
   :mod:`ambit.k8s.remotecommand`: stdin frames go to the command's stdin (a v5 close of stdin closes it), its
   stdout and stderr come back on their channels, and at exit the error channel carries the exit Status, then the
   WebSocket closes. A client that goes away ends the command (SIGTERM, which runc forwards, then SIGKILL after
   :data:`STOP_GRACE`).
3. Relays are bounded: output is read 32 KiB at a time and the next read waits until the WebSocket took the last
   frame; stdin is written with the pipe's flow control before the next frame is read.
4. A pod this node does not run, or a container the pod does not have, is 404; a container that is not running
   cannot be exec'd into (400), as the kubelet answers.
5. The socket is created mode 0600 (``connect(2)`` needs write permission on it): only root reaches it.
6. ``tty=true`` runs the command on a terminal (:meth:`ContainerExec.start_tty`; in the lab ``runc exec --tty
   --detach --console-socket`` under :mod:`ambit.lab.runtime.exec_shim`, which keeps its exit status): stdin
   frames are written to the terminal, what it shows (stdout and stderr, one stream) comes back on stdout, resize
   frames set its window size (a malformed one is dropped and logged in one line, the first
   :data:`MAX_RESIZE_WARNINGS` of a session; the session goes on), and a v5 close of stdin is ignored, as a
   terminal has no end of input but its user's ^D. The exit Status is rule 2's, sent once the command has exited
   and what it left on the terminal is read (at most :data:`STOP_GRACE` more when something it started still
   holds the terminal).
7. ``GET /attach/{ns}/{pod}/{container}`` (kube's PodAttachOptions) upgrades to the same WebSocket and attaches to
   the container's main process: its output from now on, read from its log file (which holds stdout and stderr
   merged, so it all comes on stdout's channel, or stderr's when only stderr is asked for), until the container
   stops (what is left is sent, then a Success Status) or the client goes. Stdin is refused before the upgrade
   (a 400 Status, which kubectl prints): a container without ``stdin: true`` has none, and the lab's runtime
   starts every container with its stdin on ``/dev/null`` and keeps no handle on it, so a container with
   ``stdin: true`` has none either. Not on the error channel after the upgrade: client-go drops a message on a
   channel it has not set up yet, so a refusal sent at once could be lost and kubectl exit 0. Resize messages are
   read and dropped (the main process has no terminal).
8. ``GET /portForward/{ns}/{pod}`` upgrades to a WebSocket of subprotocol ``SPDY/3.1+portforward.k8s.io`` whose
   binary messages carry a SPDY session of kube's port-forward protocol (:mod:`ambit.k8s.portforward`), relayed to
   the pod's local ports by :mod:`ambit.lab.runtime.port_forward` (at most ``max_port_forward_streams`` streams per
   session). The pod must be running (400 otherwise, as the kubelet answers); a client not offering the
   subprotocol is 400 ``Upgrade request required``; a node without a :class:`PodDialer` answers 501.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from aiohttp import WSMsgType, web

from ambit.k8s.pod_logs import LogOptions, LogOptionsError, parse_log_options, plan_window
from ambit.k8s.portforward import WEBSOCKET_PROTOCOL
from ambit.k8s.remotecommand import (
    PROTOCOLS,
    AttachOptions,
    Channel,
    ExecOptions,
    ExecOptionsError,
    Frame,
    ResizeError,
    closes_stdin,
    exit_status,
    failure_status,
    frame,
    parse_attach_options,
    parse_exec_options,
    parse_frame,
    parse_resize,
    status_message,
)
from ambit.lab.runtime.port_forward import PodDialer, PortForwardRelay
from ambit.lab.runtime.terminal import Terminal, TerminalError, receive_console

log = logging.getLogger("ambit.lab.kubelet")
_Options = TypeVar("_Options", ExecOptions, AttachOptions)

CHUNK = 32 * 1024
TAIL_LOOKBACK = 8 * 1024 * 1024
"""How far back from a file's end ``tailLines`` looks for its lines."""
MAX_MESSAGE = 1024 * 1024
MAX_ERROR_TEXT = 4096
MAX_RESIZE_WARNINGS = 3
"""Refused resize messages logged per session; the rest are counted (``ExecSession.refused_resizes``)."""
CONSOLE_AFTER_EXIT = 1.0
"""Seconds a terminal already sent is still waited for once the runtime has exited."""
STOP_GRACE = 2.0
"""Seconds an abandoned command gets between SIGTERM and SIGKILL."""


class PodTable(Protocol):
    """The pods this node runs, by namespace and name (their API objects, status included)."""

    def find_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class ContainerExec(Protocol):
    """Runs a command in a pod's container."""

    async def start(
        self, pod_uid: str, container: str, argv: Sequence[str], *, stdin: bool, merge_stderr: bool
    ) -> asyncio.subprocess.Process: ...

    async def start_tty(self, pod_uid: str, container: str, argv: Sequence[str]) -> TerminalProcess:
        """Rule 6: the command on a terminal; raises OSError or TerminalError when it cannot be started."""
        ...


@dataclass(slots=True)
class TerminalProcess:
    """A command on a terminal: the process whose exit status is the command's (its stdout and stdin are not the
    command's; its stderr, when piped, carries the runtime's own messages), the terminal, and a directory to
    remove at the end."""

    proc: asyncio.subprocess.Process
    terminal: Terminal
    scratch: Path | None = None

    def close(self) -> None:
        self.terminal.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


@dataclass(frozen=True, slots=True)
class RuncExec:
    """``runc --root R exec <container id> argv``; on a terminal, rule 6's shim and console socket."""

    runc_root: Path
    runc: str = "runc"
    scratch_dir: Path | None = None
    """Where a terminal's console socket and pid file go (a fresh 0700 directory each); None: the temp dir."""

    async def start(
        self, pod_uid: str, container: str, argv: Sequence[str], *, stdin: bool, merge_stderr: bool
    ) -> asyncio.subprocess.Process:
        from ambit.lab.runtime.oci_spec import container_id

        return await asyncio.create_subprocess_exec(
            "runc",
            "--root",
            str(self.runc_root),
            "exec",
            container_id(pod_uid, container),
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        )

    async def start_tty(self, pod_uid: str, container: str, argv: Sequence[str]) -> TerminalProcess:
        from ambit.lab.runtime.oci_spec import container_id

        scratch = Path(tempfile.mkdtemp(prefix="ambit-tty-", dir=self.scratch_dir))  # 0700: runc (root) alone connects
        console, pid_file = scratch / "console.sock", scratch / "pid"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(console))
            listener.listen(1)
            runc = [self.runc, "--root", str(self.runc_root), "exec", "--tty", "--detach"]
            runc += ["--console-socket", str(console), "--pid-file", str(pid_file), container_id(pod_uid, container)]
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ambit.lab.runtime.exec_shim",
                str(pid_file),
                str(STOP_GRACE / 2),
                *runc,
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except BaseException:
            listener.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            master = await _console_or_failure(listener, proc)
        except BaseException:
            if proc.returncode is None:  # a runtime that hangs without a terminal is not left behind
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            listener.close()
        return TerminalProcess(proc, Terminal(master), scratch)


async def _console_or_failure(listener: socket.socket, proc: asyncio.subprocess.Process) -> int:
    """The terminal runc hands over, or TerminalError with runc's own message when it exits without one."""
    loop = asyncio.get_running_loop()
    console = loop.create_task(receive_console(listener), name="exec console")
    exited = loop.create_task(proc.wait(), name="exec shim wait")
    await asyncio.wait([console, exited], return_when=asyncio.FIRST_COMPLETED)
    if not console.done():  # a quick command's shim may end first: runc sent the terminal before it exited
        await asyncio.wait([console], timeout=CONSOLE_AFTER_EXIT)
    if console.done():
        exited.cancel()
        return console.result()
    console.cancel()
    with contextlib.suppress(asyncio.CancelledError, TerminalError):
        await console
    said = (await proc.stderr.read(MAX_ERROR_TEXT)).decode(errors="replace").strip() if proc.stderr else ""
    raise TerminalError(said or f"the runtime exited with status {exited.result()} and no terminal")


def container_running(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the pod's status reports ``container`` (an init container too) running."""
    status = pod.get("status") or {}
    for cs in (*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())):
        if isinstance(cs, Mapping) and cs.get("name") == container:
            return "running" in (cs.get("state") or {})
    return False


def _container_names(pod: Mapping[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    every = (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
    return [str(c.get("name")) for c in every if isinstance(c, Mapping)]


def _status(code: int, reason: str, message: str) -> web.Response:
    doc: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    doc |= {"message": message, "reason": reason, "code": code}
    # The reason phrase carries the message too: a refused WebSocket handshake shows its client nothing else.
    phrase = message.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")
    return web.Response(status=code, reason=phrase, text=json.dumps(doc), content_type="application/json")


def _clear_socket_path(path: Path) -> None:
    """A new socket's directory (made 0700 when missing) and no stale socket in the way."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _open_log(path: Path) -> BinaryIO | None:
    """The output file, open for reading; None while the container has written nothing."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None


class KubeletServer:
    """The aiohttp application of rules 1 to 4; :meth:`serve` puts it on a unix socket (rule 5)."""

    def __init__(
        self,
        pods: PodTable,
        runner: ContainerExec,
        log_path: Callable[[str, str], Path],
        *,
        poll_interval: float = 0.25,
        clock: Callable[[], float] = time.time,
        dialer: PodDialer | None = None,
        max_port_forward_streams: int = 256,
    ) -> None:
        self.pods = pods
        self.dialer = dialer
        self.max_port_forward_streams = max_port_forward_streams
        self.runner = runner
        self.log_path = log_path
        self.poll_interval = poll_interval
        self.clock = clock
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/containerLogs/{ns}/{pod}/{container}", self._logs)
        app.router.add_get("/exec/{ns}/{pod}/{container}", self._exec)
        app.router.add_get("/attach/{ns}/{pod}/{container}", self._attach)
        app.router.add_get("/portForward/{ns}/{pod}", self._port_forward)
        return app

    async def serve(self, socket_path: Path) -> None:
        _clear_socket_path(socket_path)
        self._runner = web.AppRunner(self.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        old = os.umask(0o177)
        try:
            await web.UnixSite(self._runner, str(socket_path)).start()
        finally:
            os.umask(old)
        os.chmod(socket_path, 0o600)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _find(self, request: web.Request) -> tuple[Mapping[str, Any], str] | web.Response:
        ns, name, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        pod = self.pods.find_pod(ns, name)
        if pod is None:
            return _status(404, "NotFound", f'pod "{ns}/{name}" not found on this node')
        if container not in _container_names(pod):
            return _status(404, "NotFound", f'container "{container}" not found in pod "{ns}/{name}"')
        return pod, container

    # -- logs (rule 1) --------------------------------------------------------------------------------------------
    async def _logs(self, request: web.Request) -> web.StreamResponse:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        pod, container = found
        try:
            options = parse_log_options(request.query)
        except LogOptionsError as exc:
            return _status(exc.code, "BadRequest" if exc.code == 400 else "Invalid", exc.message)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        ns, name = request.match_info["ns"], request.match_info["pod"]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await self._stream_log(
                response.write,
                self.log_path(uid, container),
                options,
                lambda: self._alive(ns, name, uid, container) and not _client_gone(request),
            )
        return response

    def _alive(self, ns: str, name: str, uid: str, container: str) -> bool:
        pod = self.pods.find_pod(ns, name)
        return pod is not None and (pod.get("metadata") or {}).get("uid") == uid and container_running(pod, container)

    async def _stream_log(
        self, write: Callable[[bytes], Awaitable[None]], path: Path, options: LogOptions, alive: Callable[[], bool]
    ) -> None:
        while (opened := _open_log(path)) is None:
            if not options.follow or not alive():
                return
            await asyncio.sleep(self.poll_interval)
        with opened as f:
            size = os.fstat(f.fileno()).st_size
            tail = b""
            if options.tail_lines is not None:
                f.seek(max(0, size - TAIL_LOOKBACK))
                tail = f.read(size - f.tell())
            window = plan_window(options, size, tail, os.fstat(f.fileno()).st_mtime, self.clock())
            f.seek(window.start)
            left = window.limit
            while left is None or left > 0:
                chunk = f.read(CHUNK if left is None else min(CHUNK, left))
                if chunk:
                    await write(chunk)
                    if left is not None:
                        left -= len(chunk)
                    continue
                if not options.follow:
                    return
                running = alive()
                await asyncio.sleep(self.poll_interval)
                if not running and f.tell() >= os.fstat(f.fileno()).st_size:
                    return

    # -- exec (rule 2) --------------------------------------------------------------------------------------------
    async def _channel(
        self,
        request: web.Request,
        parse: Callable[[Mapping[str, Sequence[str]]], _Options],
        refuse: Callable[[Mapping[str, Any], str, _Options], str | None] = lambda *_: None,
    ) -> tuple[Mapping[str, Any], str, _Options, web.WebSocketResponse] | web.Response:
        """What exec and attach check before they speak the channel protocol: the pod and container (rule 1's
        lookup), the options (kube's 400s), a running container, ``refuse``'s reason if any (a 400), a WebSocket
        upgrade (else 400 ``Upgrade request required``); then the WebSocket, prepared."""
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        pod, container = found
        try:
            options = parse({k: request.query.getall(k) for k in request.query})
        except ExecOptionsError as exc:
            return _status(400, "BadRequest", str(exc))
        if not container_running(pod, container):
            return _status(400, "BadRequest", f'container "{container}" is not running')
        if (refused := refuse(pod, container, options)) is not None:
            return _status(400, "BadRequest", refused)
        ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=MAX_MESSAGE, autoping=True)
        if not ws.can_prepare(request).ok:  # the API server asking on behalf of a client falling back to SPDY
            return _status(400, "BadRequest", "Upgrade request required")
        await ws.prepare(request)
        return pod, container, options, ws

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        opened = await self._channel(request, parse_exec_options)
        if isinstance(opened, web.Response):
            return opened
        pod, container, options, ws = opened
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        try:
            if options.tty:
                started = await self.runner.start_tty(uid, container, options.command)
                session = ExecSession(ws, started.proc, options, started)
            else:
                proc = await self.runner.start(uid, container, options.command, stdin=options.stdin, merge_stderr=False)
                session = ExecSession(ws, proc, options)
        except (OSError, TerminalError) as exc:
            await ws.send_bytes(status_message(failure_status(f"failed to run the command: {exc}")))
            await ws.close()
            return ws
        await session.run()
        return ws

    # -- attach (rule 7) ------------------------------------------------------------------------------------------
    async def _attach(self, request: web.Request) -> web.StreamResponse:
        opened = await self._channel(request, parse_attach_options, attach_refusal)
        if isinstance(opened, web.Response):
            return opened
        pod, container, options, ws = opened
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        ns, name = request.match_info["ns"], request.match_info["pod"]
        channel = Channel.STDOUT if options.stdout or options.tty else Channel.STDERR

        async def send(chunk: bytes) -> None:
            await ws.send_bytes(frame(channel, chunk))

        async def drain_client() -> None:  # resizes and the like: nothing to act on (no terminal)
            async for _ in ws:
                pass

        follow = self._stream_log(
            send,
            self.log_path(uid, container),
            LogOptions(follow=True, tail_lines=0),
            lambda: self._alive(ns, name, uid, container) and not ws.closed,
        )
        loop = asyncio.get_running_loop()
        output = loop.create_task(follow, name="attach output")
        client = loop.create_task(drain_client(), name="attach client")
        try:
            await asyncio.wait([output, client], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (output, client):
                task.cancel()
            for task in (output, client):
                with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                    await task
        if output.done() and not output.cancelled() and output.exception() is None and not ws.closed:
            with contextlib.suppress(ConnectionResetError):
                await ws.send_bytes(status_message(exit_status(0)))
        await ws.close()
        return ws

    # -- port-forward (rule 8) ------------------------------------------------------------------------------------
    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["pod"]
        pod = self.pods.find_pod(ns, name)
        if pod is None:
            return _status(404, "NotFound", f'pod "{ns}/{name}" not found on this node')
        if str((pod.get("status") or {}).get("phase") or "") != "Running":
            return _status(400, "BadRequest", f'pod "{ns}/{name}" is not running')
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if request.headers.get("Upgrade", "").lower() != "websocket" or WEBSOCKET_PROTOCOL not in offered:
            return _status(400, "BadRequest", "Upgrade request required")
        if self.dialer is None:
            return _status(501, "NotImplemented", "this node cannot forward ports")
        ws = web.WebSocketResponse(protocols=(WEBSOCKET_PROTOCOL,), max_msg_size=MAX_MESSAGE, autoping=True)
        await ws.prepare(request)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        relay = PortForwardRelay(
            ws,
            uid,
            self.dialer,
            max_streams=self.max_port_forward_streams,
            client_gone=lambda: _client_gone(request),
            poll_interval=self.poll_interval,
        )
        await relay.run()
        return ws


def attach_refusal(pod: Mapping[str, Any], container: str, options: AttachOptions) -> str | None:
    """Rule 7: why an attach cannot be served (stdin), or None."""
    if not options.stdin:
        return None
    containers = (pod.get("spec") or {}).get("containers") or ()
    spec = next((c for c in containers if isinstance(c, Mapping) and c.get("name") == container), {})
    if spec.get("stdin") is not True:
        return f'container "{container}" was not started with stdin: true: there is no stdin to attach to'
    return (
        f'attaching to the stdin of container "{container}" is not supported: the lab\'s runtime keeps no '
        "container's stdin open (attach without -i, or use kubectl exec -it)"
    )


class ExecSession:
    """One exec's relay between its WebSocket and its process (rules 2 and 3)."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        proc: asyncio.subprocess.Process,
        options: ExecOptions,
        tty: TerminalProcess | None = None,
    ) -> None:
        self.ws = ws
        self.proc = proc
        self.options = options
        self.tty = tty
        self.refused_resizes = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.tty is None:
            pumps = [loop.create_task(self._pump(self.proc.stdout, Channel.STDOUT), name="exec stdout")]
            if self.proc.stderr is not None:
                pumps.append(loop.create_task(self._pump(self.proc.stderr, Channel.STDERR), name="exec stderr"))
        else:  # rule 6: the terminal, and the runtime's own messages, are the one output
            pumps = [loop.create_task(self._pump_terminal(self.tty.terminal), name="exec terminal")]
            pumps.append(loop.create_task(self._pump(self.proc.stderr, Channel.STDOUT), name="exec runtime"))
        feed = loop.create_task(self._feed(), name="exec stdin")
        done = loop.create_task(self._finish(pumps), name="exec wait")
        try:
            await asyncio.wait([feed, done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not done.done():  # the client went away: the command goes too
                await self._stop()
            for task in (*pumps, feed, done):
                task.cancel()
            for task in (*pumps, feed, done):
                with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                    await task
            await self._release()
        if done.done() and not done.cancelled() and done.exception() is None:
            with contextlib.suppress(ConnectionResetError):
                await self.ws.send_bytes(status_message(exit_status(done.result())))
        await self.ws.close()

    async def _stop(self) -> None:
        """SIGTERM first (runc forwards it to the command; a SIGKILL would end runc alone), then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            async with asyncio.timeout(STOP_GRACE):
                await self.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()

    async def _release(self) -> None:
        """Drop what a killed command left in its pipes, so that they reach their end and close."""
        if self.tty is not None:
            self.tty.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is None:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):  # a process the command left behind may hold the pipe open
                    while await stream.read(CHUNK):
                        pass

    async def _finish(self, pumps: list[asyncio.Task[None]]) -> int:
        if self.tty is None:
            await asyncio.gather(*pumps)
            return await self.proc.wait()
        code = await self.proc.wait()  # rule 6: then what is left on the terminal, unless something still holds it
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.gather(*pumps)
        return code

    async def _pump_terminal(self, terminal: Terminal) -> None:
        while chunk := await terminal.read():
            if self.options.stdout:
                await self.ws.send_bytes(frame(Channel.STDOUT, chunk))

    async def _pump(self, stream: asyncio.StreamReader | None, channel: Channel) -> None:
        if stream is None:
            return
        wanted = self.options.stdout if channel is Channel.STDOUT else self.options.stderr
        while chunk := await stream.read(CHUNK):
            if wanted:  # output nobody asked for is read and dropped, so the command never blocks on it
                await self.ws.send_bytes(frame(channel, chunk))

    async def _feed(self) -> None:
        stdin = self.proc.stdin
        async for msg in self.ws:
            if msg.type is not WSMsgType.BINARY:
                continue
            f = parse_frame(msg.data)
            if f is None:
                continue
            if self.tty is not None:
                await self._to_terminal(self.tty.terminal, f)
            elif f.channel is Channel.STDIN and stdin is not None and not stdin.is_closing():
                stdin.write(f.data)
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    await stdin.drain()
            elif closes_stdin(f) and stdin is not None:
                stdin.close()
        # The client closed: rule 2 ends the command (the caller kills it unless it already finished).
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    async def _to_terminal(self, terminal: Terminal, f: Frame) -> None:
        """Rule 6: input and resizes; a v5 close of stdin leaves the terminal as it is."""
        if f.channel is Channel.STDIN and self.options.stdin:
            await terminal.write(f.data)
        elif f.channel is Channel.RESIZE:
            try:
                terminal.resize(parse_resize(f.data))
            except ResizeError as exc:
                self.refused_resizes += 1
                if self.refused_resizes <= MAX_RESIZE_WARNINGS:  # a peer sending nothing else cannot flood the log
                    log.warning("exec %s: resize refused: %s", " ".join(self.options.command)[:80], exc)
