"""Container probes as the kubelet runs them: tcpSocket, httpGet and exec, with thresholds.

Theory of operation: a probe spec is parsed once from the container (:meth:`ProbeSpec.parse`, which also resolves
a named port against the container's ports). A :class:`ProbeWorker` runs one probe for one container instance:
it waits ``initialDelaySeconds``, then every ``periodSeconds`` makes one attempt bounded by ``timeoutSeconds``,
and feeds the outcome to a :class:`ProbeTracker`, the pure part, which turns consecutive outcomes into a verdict.

Where a probe runs from: tcpSocket and httpGet connect from the node runtime's own network namespace (the node's)
to the pod's IP, exactly as the kubelet does; exec runs the command inside the pod's network namespace with the
container's environment.

Rules of the tracker (the kubelet's ``prober`` worker):

1. A verdict changes only after ``successThreshold`` consecutive successes (to healthy) or ``failureThreshold``
   consecutive failures (to unhealthy); any other outcome resets the opposite run.
2. A readiness probe starts unhealthy (not ready); a liveness probe starts healthy.
3. An attempt that times out, cannot connect, answers an HTTP status outside 200-399, or exits non-zero, fails.
4. A startup probe starts unhealthy and runs only until its first verdict (:meth:`ProbeWorker.run_until_verdict`):
   one success (its ``successThreshold`` must be 1) and the container has started; ``failureThreshold``
   consecutive failures and it is restarted. Readiness and liveness probes wait for it; once it passed, the
   readiness probe runs at once rather than at its next period (the kubelet triggers it by hand), so a container
   whose startup probe is frequent and readiness probe rare (Istio's gateways: 1 s and 15 s) is ready within a
   second of answering, not fifteen. Their ``initialDelaySeconds`` still count from the container's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ambit.errors import AmbitError

log = logging.getLogger("ambit.lab.runtime.probes")

USER_AGENT = "kube-probe/1.32"
MAX_MESSAGE = 512


class ProbeConfigError(AmbitError):
    """A probe in a pod spec cannot be run as written (no handler, an unknown port name)."""


class ProbeResult(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """One probe of one container, with the Kubernetes defaults filled in."""

    handler: str
    """``tcp``, ``http`` or ``exec``."""
    port: int = 0
    host: str = ""
    """An explicit host (``httpGet.host``, ``tcpSocket.host``); empty means the pod's IP."""
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    @classmethod
    def parse(cls, probe: Mapping[str, Any], container: Mapping[str, Any]) -> ProbeSpec:
        timing: dict[str, Any] = {
            "initial_delay": float(probe.get("initialDelaySeconds") or 0),
            "period": float(probe.get("periodSeconds") or 10),
            "timeout": float(probe.get("timeoutSeconds") or 1),
            "success_threshold": int(probe.get("successThreshold") or 1),
            "failure_threshold": int(probe.get("failureThreshold") or 3),
        }
        if isinstance(probe.get("tcpSocket"), dict):
            tcp = probe["tcpSocket"]
            return cls("tcp", port=_port(tcp.get("port"), container), host=str(tcp.get("host") or ""), **timing)
        if isinstance(probe.get("httpGet"), dict):
            http = probe["httpGet"]
            headers = tuple(
                (str(h.get("name", "")), str(h.get("value", "")))
                for h in http.get("httpHeaders") or ()
                if isinstance(h, dict) and h.get("name")
            )
            path = str(http.get("path") or "/")
            return cls(
                "http",
                port=_port(http.get("port"), container),
                host=str(http.get("host") or ""),
                path=path if path.startswith("/") else "/" + path,
                scheme=str(http.get("scheme") or "HTTP").upper(),
                headers=headers,
                **timing,
            )
        if isinstance(probe.get("exec"), dict):
            command = tuple(str(part) for part in probe["exec"].get("command") or ())
            if not command:
                raise ProbeConfigError("an exec probe needs a command")
            return cls("exec", command=command, **timing)
        if isinstance(probe.get("grpc"), dict):
            raise ProbeConfigError("grpc probes are not supported by the lab")
        raise ProbeConfigError("a probe needs one of tcpSocket, httpGet or exec")


def _port(value: Any, container: Mapping[str, Any]) -> int:
    """A probe port: a number, or the name of one of the container's ports."""
    if isinstance(value, int) and not isinstance(value, bool):
        port = value
    elif isinstance(value, str) and value.isdigit():
        port = int(value)
    elif isinstance(value, str) and value:
        for declared in container.get("ports") or ():
            if isinstance(declared, dict) and declared.get("name") == value:
                port = int(declared.get("containerPort") or 0)
                break
        else:
            raise ProbeConfigError(f"the container has no port named {value!r}")
    else:
        raise ProbeConfigError(f"a probe port must be a number or a port name, not {value!r}")
    if not 0 < port < 65536:
        raise ProbeConfigError(f"probe port {port} is out of range")
    return port


@dataclass(slots=True)
class ProbeTracker:
    """Consecutive outcomes into a verdict (rules 1 and 2); pure."""

    success_threshold: int
    failure_threshold: int
    healthy: bool
    successes: int = 0
    failures: int = 0

    @classmethod
    def readiness(cls, spec: ProbeSpec) -> ProbeTracker:
        return cls(spec.success_threshold, spec.failure_threshold, healthy=False)

    @classmethod
    def liveness(cls, spec: ProbeSpec) -> ProbeTracker:
        return cls(1, spec.failure_threshold, healthy=True)

    @classmethod
    def startup(cls, spec: ProbeSpec) -> ProbeTracker:
        return cls(1, spec.failure_threshold, healthy=False)

    @property
    def failed_out(self) -> bool:
        """Unhealthy with ``failure_threshold`` consecutive failures: a startup probe's failing verdict (rule 4)."""
        return not self.healthy and self.failures >= self.failure_threshold

    def observe(self, result: ProbeResult) -> bool:
        """Count one outcome; True when the verdict changed."""
        if result is ProbeResult.SUCCESS:
            self.successes += 1
            self.failures = 0
            if not self.healthy and self.successes >= self.success_threshold:
                self.healthy = True
                return True
        else:
            self.failures += 1
            self.successes = 0
            if self.healthy and self.failures >= self.failure_threshold:
                self.healthy = False
                return True
        return False


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """Where one container instance's probes go."""

    pod_ip: str
    netns: str
    """The pod's network namespace name for exec probes; empty runs them in the runtime's own namespace."""
    env: Mapping[str, str]
    """The container's environment, for exec probes."""
    exec_prefix: tuple[str, ...] = ()
    """Runs an exec probe's command inside the container (``runc exec <id>``); empty: in ``netns`` as the runtime."""


async def probe_once(spec: ProbeSpec, target: ProbeTarget) -> tuple[ProbeResult, str]:
    """One attempt, bounded by the probe's timeout; the outcome and a message saying why it failed."""
    try:
        async with asyncio.timeout(spec.timeout):
            if spec.handler == "tcp":
                return await _tcp(spec.host or target.pod_ip, spec.port)
            if spec.handler == "http":
                return await _http(spec, spec.host or target.pod_ip)
            return await _exec(spec, target)
    except TimeoutError:
        return ProbeResult.FAILURE, f"timeout: no answer within {spec.timeout:g}s"


async def _tcp(host: str, port: int) -> tuple[ProbeResult, str]:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return ProbeResult.FAILURE, f"dial tcp {host}:{port}: connect: {_reason(exc)}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ProbeResult.SUCCESS, ""


def _reason(exc: OSError) -> str:
    """The errno's words (asyncio's own message for a failed connect only repeats the address)."""
    return os.strerror(exc.errno).lower() if exc.errno else str(exc)


async def _http(spec: ProbeSpec, host: str) -> tuple[ProbeResult, str]:
    url = f"{spec.scheme.lower()}://{host}:{spec.port}{spec.path}"
    context: ssl.SSLContext | None = None
    if spec.scheme == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False  # the kubelet does not verify probe certificates either
        context.verify_mode = ssl.CERT_NONE
    try:
        reader, writer = await asyncio.open_connection(host, spec.port, ssl=context)
    except OSError as exc:
        return ProbeResult.FAILURE, f"Get {url!r}: dial tcp {host}:{spec.port}: connect: {_reason(exc)}"
    try:
        headers = {"Host": f"{host}:{spec.port}", "User-Agent": USER_AGENT, "Accept": "*/*"}
        for name, value in spec.headers:
            headers[name] = value
        headers["Connection"] = "close"
        head = f"GET {spec.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode("latin-1"))
        await writer.drain()
        line = await reader.readline()
    except (OSError, UnicodeEncodeError) as exc:
        return ProbeResult.FAILURE, f"Get {url!r}: {exc}"
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return ProbeResult.FAILURE, f"Get {url!r}: malformed HTTP response {line[:80]!r}"
    code = int(parts[1])
    if 200 <= code < 400:
        return ProbeResult.SUCCESS, ""
    return ProbeResult.FAILURE, f"HTTP probe failed with statuscode: {code}"


async def _exec(spec: ProbeSpec, target: ProbeTarget) -> tuple[ProbeResult, str]:
    argv: Sequence[str] = spec.command
    if target.exec_prefix:
        argv = [*target.exec_prefix, *spec.command]
    elif target.netns:
        argv = ["ip", "netns", "exec", target.netns, *spec.command]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(target.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return ProbeResult.FAILURE, f"exec {spec.command[0]!r}: {exc.strerror or exc}"
    try:
        output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled (the timeout): take the whole group down, then reap
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
    if proc.returncode == 0:
        return ProbeResult.SUCCESS, ""
    text = output.decode("utf-8", "replace").strip()[:MAX_MESSAGE]
    return ProbeResult.FAILURE, f"command {list(spec.command)!r} exited with {proc.returncode}: {text}"


PRE_STOP_EXTENSION = 2.0
"""Seconds the kubelet still grants the SIGTERM once a preStop hook used up the whole grace period."""


async def run_hook(handler: Mapping[str, Any], container: Mapping[str, Any], target: ProbeTarget, budget: float) -> str:
    """A container lifecycle handler (``exec``, ``httpGet``, ``tcpSocket`` or ``sleep``), bounded by ``budget``
    seconds; the empty string when it succeeded, else why it failed (the kubelet's ``Failed...Hook`` Event)."""
    sleep = handler.get("sleep")
    if isinstance(sleep, dict):
        seconds = sleep.get("seconds")
        if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 0:
            return f"a sleep hook needs whole seconds, not {seconds!r}"
        await asyncio.sleep(min(float(seconds), max(budget, 0.0)))
        return ""
    try:
        spec = ProbeSpec.parse(handler, container)
    except ProbeConfigError as exc:
        return str(exc)
    result, message = await probe_once(replace(spec, timeout=max(budget, 0.001)), target)
    return "" if result is ProbeResult.SUCCESS else message


class ProbeWorker:
    """Runs one probe for one container instance until cancelled: ``on_verdict(healthy, message)`` when the
    verdict changes, ``on_failure(message)`` after every failed attempt (the kubelet's ``Unhealthy`` Event)."""

    def __init__(
        self,
        spec: ProbeSpec,
        tracker: ProbeTracker,
        target: ProbeTarget,
        on_verdict: Callable[[bool, str], None],
        *,
        on_failure: Callable[[str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        attempt: Callable[[ProbeSpec, ProbeTarget], Awaitable[tuple[ProbeResult, str]]] = probe_once,
    ) -> None:
        self.spec = spec
        self.tracker = tracker
        self.target = target
        self._on_verdict = on_verdict
        self._on_failure = on_failure
        self._sleep = sleep
        self._attempt = attempt

    async def _attempt_once(self) -> tuple[ProbeResult, str]:
        """One attempt, reported to ``on_failure`` when it failed."""
        result, message = await self._attempt(self.spec, self.target)
        if result is ProbeResult.FAILURE and self._on_failure is not None:
            self._on_failure(message)
        return result, message

    async def run_until_verdict(self) -> bool:
        """Probe until the tracker turns healthy (True) or has failed out (False): a startup probe (rule 4).
        ``on_verdict`` is not called; ``on_failure`` is, after every failed attempt."""
        if self.spec.initial_delay:
            await self._sleep(self.spec.initial_delay)
        while True:
            result, _ = await self._attempt_once()
            self.tracker.observe(result)
            if self.tracker.healthy:
                return True
            if self.tracker.failed_out:
                return False
            await self._sleep(self.spec.period)

    async def run(self) -> None:
        if self.spec.initial_delay:
            await self._sleep(self.spec.initial_delay)
        while True:
            result, message = await self._attempt_once()
            if self.tracker.observe(result):
                self._on_verdict(self.tracker.healthy, message)
            await self._sleep(self.spec.period)
