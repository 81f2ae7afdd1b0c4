"""The policy route that sends the proxy's connections back to ``lo`` (spec §2.1 "Plus netlink"; pure argv).

Packets whose mark carries the connmark (``0x111/0xfff``, restored from the connection by the mangle rules) are
looked up in table 100, which holds one route: ``local 0.0.0.0/0 dev lo`` (and ``::/0`` with IPv6). Replies to
connections the proxy accepted on its redirect ports thereby stay in the pod and reach the proxy's sockets.

Idempotence: ``ip route replace`` is idempotent as it is. ``ip rule`` has no ``replace``, so installing a rule is
check-then-add: :func:`rule_show_argv` lists matching rules (empty output: absent), :func:`rule_add_argv` adds.
Removal deletes; a "No such file or directory" / "No such process" answer means it was already gone
(:func:`is_already_gone`).
"""

from __future__ import annotations

from typing import Literal

from ambit.redirect.settings import InPodSettings

Family = Literal[4, 6]


def _ip(netns: str | None, family: Family) -> list[str]:
    argv = ["ip", f"-{family}"]
    return [*argv, "-n", netns] if netns else argv


def families(settings: InPodSettings) -> list[Family]:
    return [4, 6] if settings.ipv6 else [4]


def _selector(settings: InPodSettings) -> list[str]:
    return [
        "fwmark",
        settings.connmark_match,
        "priority",
        str(settings.rule_priority),
        "table",
        str(settings.route_table),
    ]


def rule_show_argv(netns: str | None, settings: InPodSettings, family: Family = 4) -> list[str]:
    """Lists the policy rule if present (prints nothing when absent)."""
    return [*_ip(netns, family), "rule", "show", *_selector(settings)]


def rule_add_argv(netns: str | None, settings: InPodSettings, family: Family = 4) -> list[str]:
    return [*_ip(netns, family), "rule", "add", *_selector(settings)]


def rule_del_argv(netns: str | None, settings: InPodSettings, family: Family = 4) -> list[str]:
    return [*_ip(netns, family), "rule", "del", *_selector(settings)]


def _route(settings: InPodSettings, family: Family) -> list[str]:
    return ["local", "0.0.0.0/0" if family == 4 else "::/0", "dev", "lo", "table", str(settings.route_table)]


def route_replace_argv(netns: str | None, settings: InPodSettings, family: Family = 4) -> list[str]:
    return [*_ip(netns, family), "route", "replace", *_route(settings, family)]


def route_del_argv(netns: str | None, settings: InPodSettings, family: Family = 4) -> list[str]:
    return [*_ip(netns, family), "route", "del", *_route(settings, family)]


def is_already_gone(stderr: bytes) -> bool:
    """Whether a failed ``ip ... del`` failed only because there was nothing to delete."""
    return any(s in stderr for s in (b"No such file or directory", b"No such process", b"FIB table does not exist"))
