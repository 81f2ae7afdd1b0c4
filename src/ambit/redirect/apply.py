"""Installing and removing redirection in a network namespace, through a command runner.

Each operation is written once, sans-IO, as a generator of :class:`Command` that receives each command's result
(a *procedure*); :func:`run_procedure` and :func:`run_procedure_async` drive one with a
:class:`~ambit.commands.CommandRunner`'s ``run`` or ``run_async`` (:class:`~ambit.commands.SubprocessRunner`, or
:class:`~ambit.commands.RecordingRunner` in unit tests).

Commands (``NETNS`` None means the runner's own namespace):

- nftables: ``ip netns exec NETNS nft -f -`` with the whole script on stdin (one transaction);
- iptables: ``iptables-save`` first (to see which of our jumps exist), then ``iptables-restore --noflush``;
- routes: ``ip -n NETNS rule show`` then ``rule add`` when absent; ``ip -n NETNS route replace``;
- the hand-over sysctl: ``ip netns exec NETNS sysctl -qw net.ipv4.tcp_migrate_req=1``, after the rules. A node
  proxy that closes its in-pod listeners while a successor's sit beside them (SO_REUSEPORT) would reset the
  connections still queued on them; with this per-netns sysctl the kernel moves them to the successor. The node
  proxy sets it itself when it may, but a node proxy in a pod sees ``/proc/sys`` read-only (an unprivileged
  container), so the node agent, which sets up the pod's namespace anyway, sets it. Best effort: a kernel without
  it (before 5.14) or a machine without ``sysctl`` leaves that small window, nothing else.

Every operation is idempotent: applying twice leaves what applying once does, and removing what is not there
succeeds. A failing command raises :class:`RedirectApplyError` with the command's stderr.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ambit.commands import CommandResult, CommandRunner
from ambit.redirect import iptables, nftables, routes
from ambit.redirect.errors import RedirectApplyError
from ambit.redirect.settings import HOST_PROBE_SNAT_IPV4, InPodSettings

Backend = Literal["nftables", "iptables"]


@dataclass(frozen=True, slots=True)
class Command:
    """One command a procedure wants run; ``may_fail``: a non-zero exit goes back to the procedure, not raised."""

    argv: tuple[str, ...]
    stdin: bytes | None = None
    may_fail: bool = False


Procedure = Generator[Command, CommandResult, None]


def run_procedure(procedure: Procedure, runner: CommandRunner) -> None:
    """Drive ``procedure`` with ``runner.run``."""
    try:
        command = next(procedure)
        while True:
            result = runner.run(command.argv, stdin=command.stdin, check=False)
            _check(command, result)
            command = procedure.send(result)
    except StopIteration:
        return


async def run_procedure_async(procedure: Procedure, runner: CommandRunner) -> None:
    """Drive ``procedure`` with ``runner.run_async``."""
    try:
        command = next(procedure)
        while True:
            result = await runner.run_async(command.argv, stdin=command.stdin, check=False)
            _check(command, result)
            command = procedure.send(result)
    except StopIteration:
        return


def _check(command: Command, result: CommandResult) -> None:
    if result.returncode != 0 and not command.may_fail:
        raise RedirectApplyError(command.argv, result.returncode, result.stderr)


def _in(netns: str | None, argv: Sequence[str]) -> tuple[str, ...]:
    return ("ip", "netns", "exec", netns, *argv) if netns else tuple(argv)


def _save_restore(netns: str | None, family: int) -> tuple[str, str]:
    return ("iptables-save", "iptables-restore") if family == 4 else ("ip6tables-save", "ip6tables-restore")


# -- procedures ----------------------------------------------------------------------------------------------------


MIGRATE_REQ = "net.ipv4.tcp_migrate_req=1"
"""The sysctl that lets a closing listener's queued connections move to its reuseport siblings (module docstring)."""


def inpod_install(netns: str | None, settings: InPodSettings, backend: Backend) -> Procedure:
    """Rules first, then the policy route (until the rules exist nothing carries the connmark), then the hand-over
    sysctl (best effort: its failure is not the pod's)."""
    if backend == "nftables":
        yield Command(_in(netns, ("nft", "-f", "-")), nftables.render_inpod_nft(settings).encode())
    else:
        for family in routes.families(settings):
            save, restore = _save_restore(netns, family)
            current = yield Command(_in(netns, (save,)))
            script = iptables.render_inpod_iptables(settings, family=family, current=current.stdout.decode())
            yield Command(_in(netns, (restore, "--noflush")), script.encode())
    for family in routes.families(settings):
        yield Command(tuple(routes.route_replace_argv(netns, settings, family)))
        shown = yield Command(tuple(routes.rule_show_argv(netns, settings, family)))
        if not shown.stdout.strip():
            yield Command(tuple(routes.rule_add_argv(netns, settings, family)))
    yield Command(_in(netns, ("sysctl", "-qw", MIGRATE_REQ)), may_fail=True)


def inpod_remove(netns: str | None, settings: InPodSettings, backend: Backend) -> Procedure:
    """Rules and routes of both IP versions, whatever ``settings.ipv6`` says now (it may have changed)."""
    if backend == "nftables":
        yield Command(_in(netns, ("nft", "-f", "-")), nftables.render_inpod_nft_removal().encode())
    else:
        for family in (4, 6):
            save, restore = _save_restore(netns, family)
            current = yield Command(_in(netns, (save,)), may_fail=family == 6)
            script = iptables.render_inpod_iptables_removal(current.stdout.decode())
            if script:
                yield Command(_in(netns, (restore, "--noflush")), script.encode())
    both: tuple[routes.Family, ...] = (4, 6)
    for family in both:
        for argv in (routes.rule_del_argv(netns, settings, family), routes.route_del_argv(netns, settings, family)):
            result = yield Command(tuple(argv), may_fail=True)
            if result.returncode != 0 and not routes.is_already_gone(result.stderr):
                raise RedirectApplyError(argv, result.returncode, result.stderr)


def host_install(
    netns: str | None, pod_ips: Iterable[str], backend: Backend, probe_snat_ip: str, kubelet_uid: int | None
) -> Procedure:
    ips = list(pod_ips)
    if backend == "nftables":
        script = nftables.render_host_nft(probe_snat_ip, ips, kubelet_uid=kubelet_uid)
        yield Command(_in(netns, ("nft", "-f", "-")), script.encode())
        return
    # The set must exist before a rule can name it.
    yield Command(_in(netns, ("ipset", "restore")), iptables.render_host_ipset(ips).encode())
    current = yield Command(_in(netns, ("iptables-save",)))
    script = iptables.render_host_iptables(probe_snat_ip, current=current.stdout.decode())
    yield Command(_in(netns, ("iptables-restore", "--noflush")), script.encode())


def host_remove(netns: str | None, backend: Backend) -> Procedure:
    if backend == "nftables":
        yield Command(_in(netns, ("nft", "-f", "-")), nftables.render_host_nft_removal().encode())
        return
    current = yield Command(_in(netns, ("iptables-save",)))
    script = iptables.render_host_iptables_removal(current.stdout.decode())
    if script:
        yield Command(_in(netns, ("iptables-restore", "--noflush")), script.encode())
    result = yield Command(_in(netns, ("ipset", "destroy", iptables.PROBE_IPSET_V4)), may_fail=True)
    if result.returncode != 0 and b"does not exist" not in result.stderr:
        raise RedirectApplyError(("ipset", "destroy", iptables.PROBE_IPSET_V4), result.returncode, result.stderr)


# -- entry points ----------------------------------------------------------------------------------------------------


def apply_inpod(netns: str | None, settings: InPodSettings, backend: Backend, runner: CommandRunner) -> None:
    """Install (or rewrite) a pod's redirection in ``netns``; idempotent."""
    run_procedure(inpod_install(netns, settings, backend), runner)


def remove_inpod(netns: str | None, settings: InPodSettings, backend: Backend, runner: CommandRunner) -> None:
    """Remove a pod's redirection from ``netns``; succeeds when there is none."""
    run_procedure(inpod_remove(netns, settings, backend), runner)


def apply_host(
    pod_ips: Iterable[str],
    backend: Backend,
    runner: CommandRunner,
    *,
    netns: str | None = None,
    probe_snat_ip: str = HOST_PROBE_SNAT_IPV4,
    kubelet_uid: int | None = None,
) -> None:
    """Install (or rewrite) the node's probe SNAT for exactly these enrolled pod IPs (IPv4 for iptables)."""
    run_procedure(host_install(netns, pod_ips, backend, probe_snat_ip, kubelet_uid), runner)


def remove_host(backend: Backend, runner: CommandRunner, *, netns: str | None = None) -> None:
    run_procedure(host_remove(netns, backend), runner)


async def apply_inpod_async(
    netns: str | None, settings: InPodSettings, backend: Backend, runner: CommandRunner
) -> None:
    await run_procedure_async(inpod_install(netns, settings, backend), runner)


async def remove_inpod_async(
    netns: str | None, settings: InPodSettings, backend: Backend, runner: CommandRunner
) -> None:
    await run_procedure_async(inpod_remove(netns, settings, backend), runner)


async def apply_host_async(
    pod_ips: Iterable[str],
    backend: Backend,
    runner: CommandRunner,
    *,
    netns: str | None = None,
    probe_snat_ip: str = HOST_PROBE_SNAT_IPV4,
    kubelet_uid: int | None = None,
) -> None:
    """:func:`apply_host` driven by ``runner.run_async``."""
    await run_procedure_async(host_install(netns, pod_ips, backend, probe_snat_ip, kubelet_uid), runner)
