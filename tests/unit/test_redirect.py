"""Redirection rules: rendering against golden files, annotations, and applying through a recorded runner.

Golden files live in ``golden/redirect/<case>.<nft|iptables>``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.redirect import InPodSettings, RedirectApplyError, RedirectSettingsError
from ambit.redirect.apply import apply_host, apply_inpod, apply_inpod_async, remove_host, remove_inpod
from ambit.redirect.iptables import (
    render_host_ipset,
    render_host_iptables,
    render_inpod_iptables,
    render_inpod_iptables_removal,
)
from ambit.redirect.nftables import render_host_nft, render_inpod_nft

GOLDEN = Path(__file__).parent / "golden" / "redirect"

CASES: dict[str, InPodSettings] = {
    "default": InPodSettings.for_pod({}),
    "dns_capture_off": InPodSettings.for_pod({"ambient.istio.io/dns-capture": "false"}),
    "inbound_bypass": InPodSettings.for_pod({"ambient.istio.io/bypass-inbound-capture": "true"}),
    "reroute_interfaces": InPodSettings.for_pod({"istio.io/reroute-virtual-interfaces": "net1, net2"}),
    "ipv6": InPodSettings.for_pod({}, ipv6=True),
}


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_inpod_nft_script_matches_its_golden_file(case: str) -> None:
    golden(f"{case}.nft", render_inpod_nft(CASES[case]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_inpod_iptables_input_matches_its_golden_file(case: str) -> None:
    settings = CASES[case]
    text = render_inpod_iptables(settings)
    if settings.ipv6:
        text += "# ip6tables-restore\n" + render_inpod_iptables(settings, family=6)
    golden(f"{case}.iptables", text)


def test_host_rules_match_their_golden_files() -> None:
    ips = ["198.18.1.7", "198.18.1.5", "fd00:198:18::5", "198.18.1.5"]
    golden("host.nft", render_host_nft("169.254.7.127", ips))
    golden("host_kubelet_uid.nft", render_host_nft("169.254.7.127", [], kubelet_uid=0))
    golden("host.iptables", render_host_iptables("169.254.7.127") + "# ipset restore\n" + render_host_ipset(ips))


# -- settings ------------------------------------------------------------------------------------------------------


def test_global_dns_capture_applies_unless_the_pod_overrides_it() -> None:
    assert InPodSettings.for_pod({}, dns_capture=False).dns_capture is False
    assert InPodSettings.for_pod({"ambient.istio.io/dns-capture": "true"}, dns_capture=False).dns_capture is True
    assert InPodSettings.for_pod({"ambient.istio.io/dns-capture": "False"}).dns_capture is False


def test_reroute_interfaces_are_split_trimmed_and_deduplicated() -> None:
    settings = InPodSettings.for_pod({"istio.io/reroute-virtual-interfaces": " a ,b,,a "})
    assert settings.reroute_interfaces == ("a", "b")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ambient.istio.io/bypass-inbound-capture", "yes please"),
        ("ambient.istio.io/dns-capture", "maybe"),
        ("istio.io/reroute-virtual-interfaces", 'eth0" accept'),
        ("istio.io/reroute-virtual-interfaces", "much-too-long-interface"),
    ],
)
def test_unusable_annotation_is_one_line_naming_it(key: str, value: str) -> None:
    with pytest.raises(RedirectSettingsError, match=key) as info:
        InPodSettings.for_pod({key: value})
    assert "\n" not in str(info.value)


def test_bad_probe_address_is_refused() -> None:
    with pytest.raises(RedirectSettingsError, match="host_probe_snat_ip"):
        InPodSettings(host_probe_snat_ip="fd00::1")
    with pytest.raises(RedirectSettingsError, match="not an IP address"):
        render_host_nft("169.254.7.127", ["nope"])


def test_bypass_leaves_out_inbound_capture_and_probe_accept() -> None:
    script = render_inpod_nft(CASES["inbound_bypass"])
    assert ":15006" not in script
    assert "saddr 169.254.7.127" not in script
    assert "redirect to :15001" in script


# -- iptables idempotence ----------------------------------------------------------------------------------------

SAVED_WITH_JUMPS = """\
*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
COMMIT
*raw
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
COMMIT
"""


def test_reapplying_iptables_adds_no_jump_that_exists() -> None:
    text = render_inpod_iptables(InPodSettings(), current=SAVED_WITH_JUMPS)
    mangle = text.split("*nat")[0]
    assert "-A PREROUTING" not in mangle
    assert "-A OUTPUT" not in mangle
    assert ":ISTIO_PRERT - [0:0]" in mangle  # declaring flushes: the chain is rewritten whole
    assert "-A PREROUTING -j ISTIO_PRERT" in text.split("*nat")[1]


def test_turning_dns_capture_off_removes_the_raw_chains_and_every_jump_copy() -> None:
    text = render_inpod_iptables(InPodSettings(dns_capture=False), current=SAVED_WITH_JUMPS)
    raw = text.split("*raw")[1]
    assert raw.count("-D OUTPUT -j ISTIO_OUTPUT") == 2
    assert "-X ISTIO_PRERT" in raw
    assert "-X ISTIO_OUTPUT" in raw


def test_iptables_removal_of_nothing_is_empty() -> None:
    assert render_inpod_iptables_removal("") == ""
    assert "-D PREROUTING -j ISTIO_PRERT" in render_inpod_iptables_removal(SAVED_WITH_JUMPS)


# -- applying through a recorded runner --------------------------------------------------------------------------


def test_nft_apply_pipes_one_script_then_installs_route_and_missing_rule() -> None:
    runner = RecordingRunner()
    apply_inpod("pod1", InPodSettings(), "nftables", runner)
    assert runner.commands == [
        "ip netns exec pod1 nft -f -",
        "ip -4 -n pod1 route replace local 0.0.0.0/0 dev lo table 100",
        "ip -4 -n pod1 rule show fwmark 0x111/0xfff priority 32764 table 100",
        "ip -4 -n pod1 rule add fwmark 0x111/0xfff priority 32764 table 100",
        "ip netns exec pod1 sysctl -qw net.ipv4.tcp_migrate_req=1",
    ]
    assert runner.calls[0].stdin == render_inpod_nft(InPodSettings()).encode()


def test_the_hand_over_sysctl_is_set_in_the_pod_and_its_failure_is_not_the_pods() -> None:
    """A node proxy in an unprivileged pod cannot write /proc/sys: the node agent sets tcp_migrate_req in the pod's
    netns, so a node proxy's successor inherits connections queued on the closing listeners; a kernel or machine
    without it still enrols the pod."""

    def respond(call: Call) -> CommandResult | None:
        if "sysctl" in call.argv:
            return CommandResult(call.argv, 255, b"", b"sysctl: cannot stat /proc/sys/net/ipv4/tcp_migrate_req\n")
        return None

    for backend in ("nftables", "iptables"):
        runner = RecordingRunner(respond)
        apply_inpod("pod1", InPodSettings(), backend, runner)
        assert runner.commands[-1] == "ip netns exec pod1 sysctl -qw net.ipv4.tcp_migrate_req=1"


def test_existing_rule_is_not_added_again() -> None:
    def respond(call: Call) -> CommandResult | None:
        if call.argv[4:6] == ("rule", "show"):
            return CommandResult(call.argv, 0, b"32764:\tfrom all fwmark 0x111/0xfff lookup 100\n")
        return None

    runner = RecordingRunner(respond)
    apply_inpod("pod1", InPodSettings(), "nftables", runner)
    assert not any(" rule add " in c for c in runner.commands)


def test_iptables_apply_reads_current_state_before_restoring() -> None:
    def respond(call: Call) -> CommandResult | None:
        if call.argv[-1] == "iptables-save":
            return CommandResult(call.argv, 0, SAVED_WITH_JUMPS.encode())
        return None

    runner = RecordingRunner(respond)
    apply_inpod("pod1", InPodSettings(), "iptables", runner)
    assert runner.commands[:2] == ["ip netns exec pod1 iptables-save", "ip netns exec pod1 iptables-restore --noflush"]
    assert runner.calls[1].stdin == render_inpod_iptables(InPodSettings(), current=SAVED_WITH_JUMPS).encode()


def test_removal_of_nothing_succeeds() -> None:
    def respond(call: Call) -> CommandResult | None:
        if "del" in call.argv:
            return CommandResult(call.argv, 2, b"", b"RTNETLINK answers: No such file or directory\n")
        return None

    for backend in ("nftables", "iptables"):
        runner = RecordingRunner(respond)
        remove_inpod("pod1", InPodSettings(), backend, runner)
        assert not any("restore" in c for c in runner.commands)  # nothing to remove in iptables


def test_failed_command_raises_with_its_stderr() -> None:
    runner = RecordingRunner(lambda call: CommandResult(call.argv, 1, b"", b"Error: syntax error"))
    with pytest.raises(RedirectApplyError, match="syntax error"):
        apply_inpod("pod1", InPodSettings(), "nftables", runner)


def test_unexpected_route_removal_failure_raises() -> None:
    def respond(call: Call) -> CommandResult | None:
        if "del" in call.argv:
            return CommandResult(call.argv, 2, b"", b"RTNETLINK answers: Operation not permitted\n")
        return None

    with pytest.raises(RedirectApplyError, match="not permitted"):
        remove_inpod("pod1", InPodSettings(), "nftables", RecordingRunner(respond))


def test_host_iptables_creates_the_ipset_before_the_rule() -> None:
    runner = RecordingRunner()
    apply_host(["198.18.1.5"], "iptables", runner)
    assert runner.commands == ["ipset restore", "iptables-save", "iptables-restore --noflush"]
    runner = RecordingRunner()
    remove_host("nftables", runner, netns="node1")
    assert runner.commands == ["ip netns exec node1 nft -f -"]


async def test_async_apply_runs_the_same_commands() -> None:
    sync, async_ = RecordingRunner(), RecordingRunner()
    apply_inpod("pod1", CASES["ipv6"], "iptables", sync)
    await apply_inpod_async("pod1", CASES["ipv6"], "iptables", async_)
    assert sync.commands == async_.commands
    assert "ip -6 -n pod1 route replace local ::/0 dev lo table 100" in sync.commands
