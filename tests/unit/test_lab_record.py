"""The lab's record (crash-safe notes) and its sweep, against a simulated machine behind the recording runner."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ambit.commands import Call, CommandResult, RecordingRunner, process_start_time
from ambit.lab.cluster.record import Record, SweepIncompleteError, sweep
from ambit.lab.network.bridge import LabNetworkError, create_network, node_exec_argv
from ambit.lab.network.topology import Topology

# -- the record -----------------------------------------------------------------------------------------------


def test_notes_are_read_back_in_order(tmp_path: Path) -> None:
    record = Record(tmp_path / "lab" / "record.jsonl")
    record.note("netns", name="ab0001-node-1")
    record.note("route", namespace=None, dst="198.18.1.0/24", via="198.18.0.11")
    entries = record.entries()
    assert [(e.kind, dict(e.fields)) for e in entries] == [
        ("netns", {"name": "ab0001-node-1"}),
        ("route", {"namespace": None, "dst": "198.18.1.0/24", "via": "198.18.0.11"}),
    ]
    assert entries[1]["dst"] == "198.18.1.0/24"


def test_a_torn_last_line_is_skipped_and_closed_by_the_next_note(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    record = Record(path)
    record.note("netns", name="ab0001-node-1")
    with open(path, "ab") as f:
        f.write(b'{"kind":"link","na')  # a crash in the middle of a write
    assert [e["name"] for e in record.entries()] == ["ab0001-node-1"]
    record.note("netns", name="ab0001-node-2")
    assert [e["name"] for e in record.entries()] == ["ab0001-node-1", "ab0001-node-2"]
    assert path.read_bytes().endswith(b"\n")


def test_a_missing_record_has_no_entries(tmp_path: Path) -> None:
    assert Record(tmp_path / "nothing.jsonl").entries() == []


def test_unknown_kinds_and_missing_fields_are_refused(tmp_path: Path) -> None:
    record = Record(tmp_path / "record.jsonl")
    with pytest.raises(ValueError, match="unknown record kind"):
        record.note("socket", path="/x")
    with pytest.raises(ValueError, match="needs start_time"):
        record.note("process", pid=1, what="x")
    assert record.entries() == []


def test_process_start_time_reads_field_22_of_our_own_stat() -> None:
    import os

    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert process_start_time(os.getpid()) == int(stat.rsplit(")", 1)[1].split()[19])
    assert process_start_time(2**22 + 12345) is None


# -- the sweep, on a simulated machine ------------------------------------------------------------------------


@dataclass
class Machine:
    """Enough of ``ip`` and ``nft`` for the sweep: namespaces, root links and routes, tables, pids per netns."""

    netns: dict[str, list[int]] = field(default_factory=dict)
    links: list[str] = field(default_factory=lambda: ["lo", "eth0"])
    routes: list[dict[str, str]] = field(default_factory=list)
    tables: set[tuple[str, str, str]] = field(default_factory=set)  # (netns or "", family, name)

    def respond(self, call: Call) -> CommandResult:
        argv = list(call.argv)
        ok = CommandResult(call.argv, 0)
        gone = CommandResult(call.argv, 1, b"", b"No such file or directory")
        netns = ""
        if argv[:3] == ["ip", "netns", "exec"]:
            netns, argv = argv[3], argv[4:]
        match argv:
            case ["ip", "netns", "list"]:
                text = "".join(f"{name} (id: {i})\n" for i, name in enumerate(self.netns))
                return CommandResult(call.argv, 0, text.encode())
            case ["ip", "netns", "pids", name]:
                pids = self.netns.get(name, [])
                return CommandResult(call.argv, 0, "".join(f"{p}\n" for p in pids).encode())
            case ["ip", "netns", "delete", name]:
                return ok if self.netns.pop(name, None) is not None else gone
            case ["ip", "-j", "link", "show"]:
                return CommandResult(call.argv, 0, json.dumps([{"ifname": n} for n in self.links]).encode())
            case ["ip", "link", "delete", name]:
                if name not in self.links:
                    return gone
                self.links.remove(name)
                self.routes = [r for r in self.routes if r["dev"] != name]
                return ok
            case ["ip", "-j", "-4", "route", "show"]:
                return CommandResult(call.argv, 0, json.dumps(self.routes).encode())
            case ["ip", "route", "delete", dst, "via", via, "dev", dev]:
                route = {"dst": dst, "gateway": via, "dev": dev}
                if route not in self.routes:
                    return gone
                self.routes.remove(route)
                return ok
            case ["nft", "list", "table", family, name]:
                return ok if (netns, family, name) in self.tables else gone
            case ["nft", "delete", "table", family, name]:
                if (netns, family, name) not in self.tables:
                    return gone
                self.tables.discard((netns, family, name))
                return ok
        raise AssertionError(f"unexpected command {call.argv}")


def lab(tmp_path: Path, lab_id: str = "1234") -> Topology:
    return Topology(lab_id, 2, str(tmp_path / "lab"))


def built(topology: Topology) -> tuple[Machine, RecordingRunner, Record]:
    """A machine with a 2-node lab (and another lab's things beside it), and the record the lab wrote."""
    p = topology.prefix
    machine = Machine(
        netns={f"{p}-node-1": [101], f"{p}-node-2": [], f"{p}-p-0a1b2c3d4e5f": [102], "ab9999-node-1": [900]},
        links=["lo", "eth0", f"{p}-br", f"{p}-n1", f"{p}-n2", "ab9999-br", "docker0"],
        routes=[
            {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
            {"dst": "198.18.1.0/24", "gateway": "198.18.0.11", "dev": f"{p}-br"},
            {"dst": "198.18.2.0/24", "gateway": "198.18.0.12", "dev": f"{p}-br"},
            {"dst": "198.18.1.0/24", "gateway": "198.18.0.11", "dev": "ab9999-br"},
        ],
        tables={(f"{p}-node-1", "inet", "ambit"), ("", "inet", f"{p}-svc"), ("", "inet", "filter")},
    )
    runner = RecordingRunner(respond=machine.respond, processes={100: 5000, 101: 5001, 102: 5002, 900: 9000})
    record = Record(topology.record_file)
    record.note("process", pid=100, start_time=5000, what="apiserver")
    record.note("process", pid=555, start_time=1, what="long gone")
    record.note("netns", name=f"{p}-node-1")
    record.note("nft-table", netns=f"{p}-node-1", family="inet", name="ambit")
    record.note("nft-table", netns=None, family="inet", name=f"{p}-svc")
    record.note("nft-table", netns=None, family="inet", name="filter")  # not ours by name: never deleted
    record.note("dir", path=str(topology.node_dir("node-1")))
    record.note("file", path="/etc/hostname")  # outside the lab and without the prefix: never deleted
    topology.node_dir("node-1").mkdir(parents=True)
    (topology.node_dir("node-1") / "runtime.log").write_text("x")
    return machine, runner, record


def test_sweep_removes_everything_of_the_lab_and_nothing_else(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    machine, runner, record = built(topology)
    p = topology.prefix

    removed = sweep(topology, record, runner)

    assert machine.netns == {"ab9999-node-1": [900]}
    assert machine.links == ["lo", "eth0", "ab9999-br", "docker0"]
    assert machine.routes == [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "198.18.1.0/24", "gateway": "198.18.0.11", "dev": "ab9999-br"},
    ]
    assert machine.tables == {("", "inet", "filter")}
    assert runner.processes == {900: 9000}
    assert not topology.node_dir("node-1").exists()
    assert Path("/etc/hostname").exists()
    assert removed == [
        "process 100 (apiserver)",
        f"process 101 (in {p}-node-1)",
        f"process 102 (in {p}-p-0a1b2c3d4e5f)",
        f"nft table inet ambit in {p}-node-1",
        f"nft table inet {p}-svc",
        f"route 198.18.1.0/24 via 198.18.0.11 dev {p}-br",
        f"route 198.18.2.0/24 via 198.18.0.12 dev {p}-br",
        f"link {p}-n1",
        f"link {p}-n2",
        f"link {p}-br",
        f"netns {p}-p-0a1b2c3d4e5f",
        f"netns {p}-node-2",
        f"netns {p}-node-1",
        f"dir {topology.node_dir('node-1')}",
    ]
    assert all(p in " ".join(argv) for argv in _mutations(runner))


def _mutations(runner: RecordingRunner) -> list[tuple[str, ...]]:
    return [call.argv for call in runner.calls if "delete" in call.argv]


def test_a_second_sweep_removes_nothing(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    _, runner, record = built(topology)
    sweep(topology, record, runner)
    runner.calls.clear()
    assert sweep(topology, record, runner) == []
    assert _mutations(runner) == []


def test_processes_get_sigterm_then_sigkill_when_they_linger(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    _, runner, record = built(topology)
    runner.lethal = frozenset({signal.SIGKILL})  # every process ignores SIGTERM
    sweep(topology, record, runner)
    assert runner.signals == [
        (100, signal.SIGTERM),
        (101, signal.SIGTERM),
        (102, signal.SIGTERM),
        (100, signal.SIGKILL),
        (101, signal.SIGKILL),
        (102, signal.SIGKILL),
    ]
    assert runner.slept == pytest.approx(2.0, abs=0.1)
    assert 900 in runner.processes


def test_a_recorded_pid_now_used_by_another_process_is_left_alone(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    _, runner, record = built(topology)
    runner.processes[100] = 7777  # pid 100 was reused after the lab's apiserver died
    removed = sweep(topology, record, runner)
    assert runner.processes == {100: 7777, 900: 9000}
    assert not any(r.startswith("process 100") for r in removed)


def test_sweep_reports_what_it_could_not_remove(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    machine, runner, record = built(topology)
    stuck = f"{topology.prefix}-node-2"

    def respond(call: Call) -> CommandResult:
        if call.argv == ("ip", "netns", "delete", stuck):
            return CommandResult(call.argv, 1, b"", b"Device or resource busy")
        return machine.respond(call)

    runner.respond = respond
    with pytest.raises(SweepIncompleteError, match=f"netns {stuck}") as caught:
        sweep(topology, record, runner)
    assert f"netns {topology.prefix}-node-1" in caught.value.removed


def test_sweep_of_a_lab_that_never_started_is_empty(tmp_path: Path) -> None:
    topology = lab(tmp_path)
    machine = Machine()
    runner = RecordingRunner(respond=machine.respond)
    assert sweep(topology, Record(topology.record_file), runner) == []


def test_garbage_from_ip_does_not_break_the_sweep(tmp_path: Path) -> None:
    topology = lab(tmp_path)

    def respond(call: Call) -> CommandResult:
        if "-j" in call.argv:
            return CommandResult(call.argv, 0, b"{not json")
        return CommandResult(call.argv, 0, b"\n\n")

    runner = RecordingRunner(respond=respond)
    assert sweep(topology, Record(topology.record_file), runner) == []


# -- the network notes everything before creating it ----------------------------------------------------------


def test_every_thing_the_network_creates_is_in_the_record_before_it_exists(tmp_path: Path) -> None:
    topology = Topology("4242", 2, str(tmp_path / "lab"))
    record = Record(topology.record_file)
    created: list[str] = []

    def respond(call: Call) -> CommandResult | None:
        argv = list(call.argv)
        if argv[:2] == ["ip", "-n"]:
            netns, argv = argv[2], ["ip", *argv[3:]]
        else:
            netns = None
        noted = {(e.kind, e.get("name"), e.get("dst"), e.get("namespace")) for e in record.entries()}
        match argv:
            case ["ip", "netns", "add", name]:
                assert ("netns", name, None, None) in noted
                created.append(f"netns {name}")
            case ["ip", "link", "add", name, *_]:
                assert ("link", name, None, None) in noted
                created.append(f"link {name}")
            case ["ip", "route", "add", dst, *_]:
                assert ("route", None, dst, netns) in noted
                created.append(f"route {netns or 'root'} {dst}")
        return None

    create_network(topology, record, RecordingRunner(respond=respond))

    p = topology.prefix
    assert created == [
        f"link {p}-br",
        f"netns {p}-node-1",
        f"link {p}-n1",
        f"netns {p}-node-2",
        f"link {p}-n2",
        f"route {p}-node-1 198.18.2.0/24",
        "route root 198.18.1.0/24",
        f"route {p}-node-1 198.19.0.0/16",
        f"route {p}-node-2 198.18.1.0/24",
        "route root 198.18.2.0/24",
        f"route {p}-node-2 198.19.0.0/16",
        "route root 198.18.0.224/28",
    ]
    assert [e["path"] for e in record.entries() if e.kind == "dir"] == [
        str(topology.node_dir("node-1")),
        str(topology.node_dir("node-2")),
    ]
    assert (topology.cni_bin_dir("node-1") / "bridge").is_symlink()


def test_the_network_refuses_addresses_another_lab_holds(tmp_path: Path) -> None:
    topology = Topology("4242", 2, str(tmp_path / "lab"))
    record = Record(topology.record_file)

    def respond(call: Call) -> CommandResult | None:
        if call.argv[:4] == ("ip", "-j", "-4", "route"):
            routes = [{"dst": "198.18.2.0/24", "gateway": "198.18.0.12", "dev": "ab0bad-br"}]
            return CommandResult(call.argv, 0, json.dumps(routes).encode())
        return None

    runner = RecordingRunner(respond=respond)
    with pytest.raises(LabNetworkError, match=r"198\.18\.2\.0/24 is routed via ab0bad-br"):
        create_network(topology, record, runner)
    assert record.entries() == []
    assert all("add" not in call.argv for call in runner.calls)


def test_node_exec_argv_wraps_a_command_in_the_nodes_namespace() -> None:
    topology = Topology("4242", 2, "/nonexistent")
    assert node_exec_argv(topology, "node-2", ["ip", "route"]) == [
        "ip",
        "netns",
        "exec",
        "ab4242-node-2",
        "ip",
        "route",
    ]
    with pytest.raises(ValueError, match="no node 'node-3'"):
        node_exec_argv(topology, "node-3", ["true"])
