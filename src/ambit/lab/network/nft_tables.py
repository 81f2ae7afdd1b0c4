"""Keeping one nft script in force inside a node namespace, re-rendered from informers as the cluster changes.

The lab's node runtime keeps two such scripts per node: the Service rules (:mod:`.services_apply`, kube-proxy's
role) and the NetworkPolicy table (:mod:`.policies_apply`, a policy agent's role). Both follow the same loop, which
lives here once:

1. ``nft -f -`` runs in the node's namespace (``ip netns exec NETNS nft -f -``, or plain ``nft -f -`` for netns
   ``""``: a caller already inside the node) with the script on stdin. A script replaces whole tables in one
   transaction, so a failed apply leaves the previous rules in force. An ``nft`` that does not finish within
   :data:`NFT_TIMEOUT` seconds is killed and counts as exit code 124.
2. Removing runs ``add table`` + ``delete table`` for each table: idempotent, and a namespace that is already gone
   counts as removed.
3. :class:`TableKeeper` starts its informers and applies its first script only once every kind is listed (earlier,
   objects would look absent: a Service without endpoints, a policy without peers). After that any event marks the
   script dirty; one task re-renders after ``debounce`` seconds (so a burst of changes costs one render) and runs
   ``nft`` only when the script differs from the one in force.
4. A failed pass is logged and retried after a delay that doubles from ``retry_initial`` up to ``retry_max``; a
   success resets it. An error that is not nft's own is logged with its traceback: one bad pass never ends the task.
5. A reason an object was left out is logged once while it lasts, not on every render.

Commands go through a :class:`~ambit.commands.CommandRunner` (unit tests use a
:class:`~ambit.commands.RecordingRunner`; :class:`~ambit.commands.SubprocessRunner` is the real one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

from ambit.commands import CommandResult, CommandRunner, SubprocessRunner
from ambit.errors import AmbitError
from ambit.k8s import Informer, InformerSettings, KubeClient, ResourceKind

NFT_TIMEOUT = 10.0
"""Seconds an ``nft`` run may take before it is killed (exit code 124)."""
_NO_NETNS = b"Cannot open network namespace"


class NftRulesError(AmbitError):
    """``nft`` refused a script (or could not be run) in a node namespace."""

    what: ClassVar[str] = "nft rules"

    def __init__(self, netns: str, action: str, returncode: int, stderr: bytes) -> None:
        self.netns = netns
        self.returncode = returncode
        self.stderr = stderr.decode(errors="replace").strip()
        super().__init__(f"{action} {self.what} in {netns}: nft exited {returncode}: {self.stderr[-500:]}")


def _nft(netns: str) -> list[str]:
    return ["ip", "netns", "exec", netns, "nft", "-f", "-"] if netns else ["nft", "-f", "-"]


async def run_nft(netns: str, script: bytes, runner: CommandRunner) -> CommandResult:
    """``nft -f -`` with ``script`` on stdin (rule 1); one that outlasts :data:`NFT_TIMEOUT` is reported as exit 124."""
    argv = _nft(netns)
    try:
        async with asyncio.timeout(NFT_TIMEOUT):
            return await runner.run_async(argv, stdin=script, check=False)
    except TimeoutError:
        return CommandResult(tuple(argv), 124, b"", f"timed out after {NFT_TIMEOUT} s".encode())


async def apply_script(netns: str, script: str, runner: CommandRunner, error: type[NftRulesError]) -> None:
    """Run ``script`` in ``netns`` (``""``: this process's namespace); raises ``error`` when nft refuses it."""
    result = await run_nft(netns, script.encode(), runner)
    if result.returncode != 0:
        raise error(netns or "this namespace", "applying", result.returncode, result.stderr)


def removal_script(tables: Sequence[tuple[str, str]]) -> bytes:
    """The script that deletes each (family, name) table whether or not it exists (rule 2)."""
    return "".join(f"add table {family} {name}\ndelete table {family} {name}\n" for family, name in tables).encode()


async def remove_tables(netns: str, script: bytes, runner: CommandRunner, error: type[NftRulesError]) -> None:
    """Run a :func:`removal_script` in ``netns``; a namespace that is already gone counts as done (rule 2)."""
    result = await run_nft(netns, script, runner)
    if result.returncode != 0 and not (netns and _NO_NETNS in result.stderr):
        raise error(netns or "this namespace", "removing", result.returncode, result.stderr)


@dataclass(frozen=True, slots=True)
class KeeperSettings:
    """How a :class:`TableKeeper` batches changes and retries (rules 3 and 4)."""

    debounce: float = 0.05
    """Seconds to wait after a change for more changes before rendering once for all of them."""
    retry_initial: float = 0.5
    """Seconds before retrying a failed apply; doubles on each failure up to ``retry_max``."""
    retry_max: float = 10.0
    informer: InformerSettings | None = None
    """Settings of the keeper's informers (their defaults when None)."""


@dataclass(slots=True)
class KeeperStats:
    """Counters, for metrics and tests."""

    renders: int = 0
    applies: int = 0
    unchanged: int = 0
    """Renders that gave the script already applied (no ``nft`` run)."""
    failures: int = 0


@dataclass(frozen=True, slots=True)
class Rendering:
    """What one render gives the keeper: the script, the reasons objects were left out, and a line for the log."""

    script: str
    skipped: Sequence[str]
    summary: str


class TableKeeper(ABC):
    """Rules 3-5 for one script in one namespace; a subclass says what it watches and how it renders."""

    what: ClassVar[str]
    """The rules' name in log lines and task names ("service rules")."""
    error: ClassVar[type[NftRulesError]]
    removal: ClassVar[bytes]
    """The :func:`removal_script` of the subclass's tables."""

    def __init__(
        self,
        client: KubeClient,
        watched: Sequence[ResourceKind],
        *,
        netns: str,
        runner: CommandRunner | None,
        settings: KeeperSettings,
        sleep: Callable[[float], Awaitable[None]],
        log: logging.Logger,
    ) -> None:
        self.netns = netns
        self.settings = settings
        self.stats = KeeperStats()
        self._runner = runner or SubprocessRunner()
        self._sleep = sleep
        self._log = log
        self._dirty = asyncio.Event()
        self._applied: str | None = None
        self._reported: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._where = netns or "this namespace"
        changed = self._changed
        self._informers = tuple(
            Informer(client, kind, on_add=changed, on_update=changed, on_delete=changed, settings=settings.informer)
            for kind in watched
        )

    @abstractmethod
    def render(self, caches: Sequence[list[dict[str, Any]]]) -> Rendering:
        """The script for the informers' current caches, in the order of ``watched``."""

    def _changed(self, *objs: object) -> None:
        self._dirty.set()

    @property
    def applied_script(self) -> str | None:
        """The script in force in the namespace, as far as this keeper knows."""
        return self._applied

    async def start(self) -> None:
        """Sync every informer, apply the first script (raises :attr:`error`), then follow changes (rule 3)."""
        if self._task is not None:
            return
        for informer in self._informers:
            informer.start()
        try:
            for informer in self._informers:
                await informer.wait_synced()
            self._dirty.clear()
            await self.sync()
        except BaseException:
            for informer in self._informers:
                await informer.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.what} in {self._where}")

    async def aclose(self) -> None:
        """Stop following changes and remove the tables from the namespace."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._informers:
            await informer.aclose()
        await remove_tables(self.netns, self.removal, self._runner, self.error)
        self._applied = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def sync(self) -> bool:
        """Render from the informers' caches and apply if the script changed; True when ``nft`` ran."""
        rendering = self.render([informer.items() for informer in self._informers])
        self.stats.renders += 1
        self._report(rendering.skipped)
        if rendering.script == self._applied:
            self.stats.unchanged += 1
            return False
        try:
            await apply_script(self.netns, rendering.script, self._runner, self.error)
        except NftRulesError:
            self.stats.failures += 1
            raise
        self._applied = rendering.script
        self.stats.applies += 1
        self._log.info("%s in %s: %s", self.what, self._where, rendering.summary)
        return True

    def _report(self, skipped: Sequence[str]) -> None:
        """Rule 5."""
        current = set(skipped)
        for reason in sorted(current - self._reported):
            self._log.warning("%s in %s: skipped %s", self.what, self._where, reason)
        self._reported = current

    async def _run(self) -> None:
        delay = self.settings.retry_initial
        while True:
            await self._dirty.wait()
            await self._sleep(self.settings.debounce)
            self._dirty.clear()
            try:
                await self.sync()
            except Exception as exc:  # rule 4: one bad pass must not end the task
                if not isinstance(exc, NftRulesError):
                    self._log.exception("%s in %s: sync failed", self.what, self._where)
                self._log.warning("%s; retrying in %.1fs", exc, delay)
                self._dirty.set()
                await self._sleep(delay)
                delay = min(delay * 2, self.settings.retry_max)
                continue
            delay = self.settings.retry_initial
