"""The DNS proxy benchmark: queries per second and latency of a pod's DNS proxy against dnsmasq (issue 19).

``python -m bench.dns [--quick]`` (``make bench-dns``) measures, side by side in one run, on loopback:

1. **cached mesh names**: dnsperf asks for the mesh's Services (``svc-I.ns-J.svc.cluster.local``, A), answered by
   the node proxy's DNS proxy from its workload state (:mod:`bench.dns_proxy`: the real
   :class:`~ambit.dns.server.DnsServer` a node proxy runs per pod, on uvloop, holding ``services`` Services), and
   by dnsmasq answering the same names from a hosts file (the reference);
2. **forwarded names**: dnsperf asks for names outside the mesh (``ext-I.example.com``), which the proxy forwards
   to dnsmasq as it forwards to a pod's resolver, against dnsmasq asked directly (the reference).

For each, with ``outstanding`` queries in flight (below the proxy's 64 forwards in flight per pod, so that no
query is refused for overload): the NOERROR answers per second at saturation, and the servers' CPU time per answer
meanwhile (the proxy's plus dnsmasq's when the proxy forwards: all the work an answer took; read from ``/proc``);
then p50/p99 latency at a fixed rate, the same for both sides of a scenario: a quarter of what the proxy answered
at saturation in that round, at most ``latency_qps`` (:func:`latency_rate`), from dnsperf's own per-response times
(``-v``). Scenarios are interleaved round by round and each figure is the median over rounds, with dnsmasq's
figure of the same run as the reference and the ratio.

Where it runs: a private network namespace (and PID namespace, with its own ``/proc``). The proxy's forwarder never
forwards to a loopback address (a pod's loopback is the pod's own), so dnsmasq listens on :data:`UPSTREAM_IP`, a
non-loopback address put on ``lo`` of that namespace; the proxy listens on 127.0.0.1:15053 as in a pod. ``main``
re-runs itself under ``unshare --net --pid --fork --mount-proc`` (with ``--map-root-user`` when not root): nothing
on the machine is changed, and every child (dnsmasq, the proxy, dnsperf) dies with the benchmark whatever way it
ends, since the kernel ends a PID namespace's processes when its first process (this benchmark) exits. The
children are also ended by their pids in ``finally``. dnsperf runs on one CPU and the servers on another, when
there are two.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rcode

from ambit.errors import AmbitError
from bench.dns_proxy import mesh_name, mesh_vip
from bench.dnsperf import DnsperfError, Latencies, Summary, dnsperf_argv, parse_latencies, parse_summary
from bench.mesh.probes import cpu_seconds
from bench.report import Measurement, Report, median, percentile

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

NETNS_ENV = "AMBIT_BENCH_DNS_NETNS"
"""Set (to ``root`` or ``user``) in the re-run inside the private namespaces."""
UPSTREAM_IP = "198.18.253.53"
PROXY = ("127.0.0.1", 15053)
DNSMASQ = (UPSTREAM_IP, 53)
NAMESPACES = 10
FIRST_EXTERNAL = 0xC612C800  # 198.18.200.0
TOOLS = ("dnsperf", "dnsmasq", "ip", "taskset")
LATENCY_SHARE = 0.25


class DnsBenchError(AmbitError):
    """A tool is missing, a server did not start or answered wrong, or dnsperf failed."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rounds: int
    saturation_seconds: float
    latency_seconds: float
    latency_qps: int
    services: int = 1000
    clients: int = 4
    outstanding: int = 16


PROFILES = {
    "quick": Profile("quick", rounds=1, saturation_seconds=3, latency_seconds=3, latency_qps=1000),
    "full": Profile("full", rounds=3, saturation_seconds=10, latency_seconds=8, latency_qps=1000),
}


@dataclass(frozen=True, slots=True)
class Target:
    label: str
    address: tuple[str, int]
    queries: str
    """``mesh`` or ``external``: which query file dnsperf reads."""
    servers: tuple[str, ...]
    """The server processes that do the work of an answer, whose CPU time counts."""


SCENARIOS: dict[str, tuple[Target, Target]] = {
    "cached mesh names": (
        Target("ambit DNS proxy", PROXY, "mesh", ("proxy",)),
        Target("dnsmasq, hosts file", DNSMASQ, "mesh", ("dnsmasq",)),
    ),
    "forwarded names": (
        Target("ambit DNS proxy → dnsmasq", PROXY, "external", ("proxy", "dnsmasq")),
        Target("dnsmasq direct", DNSMASQ, "external", ("dnsmasq",)),
    ),
}
"""Each scenario: (the proxy, its reference)."""


def external_name(index: int) -> str:
    return f"ext-{index}.example.com"


def external_ip(index: int) -> str:
    return socket.inet_ntoa((FIRST_EXTERNAL + index).to_bytes(4, "big"))


def hosts_file(services: int) -> str:
    """dnsmasq's hosts file: every mesh name with its VIP, and as many external names."""
    lines = [f"{mesh_vip(i)} {mesh_name(i, NAMESPACES)}" for i in range(services)]
    lines += [f"{external_ip(i)} {external_name(i)}" for i in range(services)]
    return "\n".join(lines) + "\n"


def query_file(names: list[str]) -> str:
    """dnsperf's input: each name once, type A, in a fixed shuffled order (no name twice in a row)."""
    shuffled = list(names)
    random.Random(19).shuffle(shuffled)
    return "".join(f"{name} A\n" for name in shuffled)


# -- children -------------------------------------------------------------------------------------------------------


class Children:
    """The processes this run started, on ``cpu`` when given; :meth:`stop_all` ends each by its pid (SIGTERM,
    then SIGKILL). Should this process die first, the PID namespace's end takes them (module docstring)."""

    def __init__(self, cpu: int | None) -> None:
        self._procs: list[subprocess.Popen[str]] = []
        self._cpu = cpu

    def start(self, argv: list[str], *, log: Path, stdout: int | None = None) -> subprocess.Popen[str]:
        if self._cpu is not None:
            argv = ["taskset", "--cpu-list", str(self._cpu), *argv]
        with log.open("a") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err, text=True, cwd=REPO)
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def stop_all(self) -> None:
        while self._procs:
            self.stop(self._procs.pop())


def _cpus() -> tuple[int | None, int | None]:
    """(the load generator's CPU, the servers' CPU), or no pinning on one CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else (None, None)


@contextmanager
def servers(tmp: Path, profile: Profile, cpu: int | None) -> Iterator[dict[str, int]]:
    """dnsmasq and the DNS proxy, answering: their pids by name; both ended on the way out."""
    hosts = tmp / "hosts"
    hosts.write_text(hosts_file(profile.services))
    hosts.chmod(0o644)
    children = Children(cpu)
    try:
        # Root: dnsmasq drops to nobody. In a user namespace "root" is the caller, and nobody is not mapped.
        user = "nobody" if os.environ.get(NETNS_ENV) == "root" else "root"
        dnsmasq = ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts"]
        dnsmasq += [f"--addn-hosts={hosts}", f"--port={DNSMASQ[1]}", f"--listen-address={UPSTREAM_IP}"]
        dnsmasq += ["--bind-interfaces", "--cache-size=4096", f"--pid-file={tmp / 'dnsmasq.pid'}", f"--user={user}"]
        pids = {"dnsmasq": children.start(dnsmasq, log=tmp / "dnsmasq.log").pid}
        _wait_answering(DNSMASQ, mesh_name(0, NAMESPACES), mesh_vip(0), tmp / "dnsmasq.log")
        proxy = [sys.executable, "-m", "bench.dns_proxy", "--listen", f"{PROXY[0]}:{PROXY[1]}"]
        proxy += ["--upstream", f"{DNSMASQ[0]}:{DNSMASQ[1]}", "--services", str(profile.services)]
        proxy += ["--namespaces", str(NAMESPACES)]
        child = children.start(proxy, log=tmp / "proxy.log", stdout=subprocess.PIPE)
        assert child.stdout is not None
        readable, _, _ = select.select([child.stdout], [], [], 30)
        ready = child.stdout.readline() if readable else ""
        if not ready.startswith("ready udp "):
            raise DnsBenchError(f"the DNS proxy did not start: {_log_tail(tmp / 'proxy.log')}")
        _wait_answering(PROXY, mesh_name(profile.services - 1, NAMESPACES), mesh_vip(profile.services - 1), None)
        _wait_answering(PROXY, external_name(0), external_ip(0), tmp / "proxy.log")
        pids["proxy"] = child.pid  # taskset execs its command: the same process
        yield pids
    finally:
        children.stop_all()


def _wait_answering(server: tuple[str, int], name: str, address: str, log: Path | None) -> None:
    """Ask ``server`` for ``name`` until it answers ``address`` (10 s at most)."""
    deadline = time.monotonic() + 10
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = dns.query.udp(dns.message.make_query(name, "A"), server[0], port=server[1], timeout=0.5)
        except (dns.exception.DNSException, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
            continue
        got = sorted(rd.to_text() for rrset in response.answer for rd in rrset if rd.rdtype == 1)
        if got == [address]:
            return
        last = f"{dns.rcode.to_text(response.rcode())} {got}"
        time.sleep(0.1)
    tail = f"; log: {_log_tail(log)}" if log is not None else ""
    raise DnsBenchError(f"{server[0]}:{server[1]} did not answer {name} with {address} ({last}){tail}")


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return "(no log)"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " / ".join(lines[-3:]) or "(empty)"


# -- measuring ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One target's figures in one round: a saturation run, then a verbose run at ``rate`` queries/s."""

    saturation: Summary
    cpu_seconds: float
    """CPU time the target's server processes used during the saturation run."""
    latency: Latencies
    rate: int

    @property
    def cpu_per_answer(self) -> float:
        """Microseconds of server CPU per NOERROR answer at saturation."""
        answers = self.saturation.rcodes.get("NOERROR", 0)
        return self.cpu_seconds / answers * 1e6 if answers else float("nan")


def _dnsperf(argv: list[str], seconds: float, cpu: int | None, tmp: Path) -> str:
    children = Children(cpu)
    try:
        proc = children.start(argv, log=tmp / "dnsperf.log", stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=seconds + 30)
    finally:
        children.stop_all()
    if proc.returncode != 0:
        raise DnsperfError(f"dnsperf exited with {proc.returncode}: {_log_tail(tmp / 'dnsperf.log')}")
    return out


def saturate(
    target: Target, files: dict[str, Path], profile: Profile, pids: dict[str, int], cpu: int | None, tmp: Path
) -> tuple[Summary, float]:
    """As many queries as ``target`` answers, ``profile.outstanding`` in flight, for the profile's time; and the CPU
    seconds its servers used meanwhile."""
    host, port = target.address
    argv = dnsperf_argv(
        host, port, files[target.queries], profile.saturation_seconds,
        clients=profile.clients, outstanding=profile.outstanding,
    )  # fmt: skip
    servers = [pids[name] for name in target.servers]
    before = cpu_seconds(servers)
    out = _dnsperf(argv, profile.saturation_seconds, cpu, tmp)
    return parse_summary(out), cpu_seconds(servers) - before


def pace(target: Target, files: dict[str, Path], rate: int, profile: Profile, cpu: int | None, tmp: Path) -> Latencies:
    """Every response's latency at ``rate`` queries/s (one client)."""
    host, port = target.address
    argv = dnsperf_argv(
        host, port, files[target.queries], profile.latency_seconds,
        clients=1, outstanding=profile.outstanding, max_qps=rate, verbose=True,
    )  # fmt: skip
    return parse_latencies(_dnsperf(argv, profile.latency_seconds, cpu, tmp).splitlines())


def latency_rate(proxy_saturation: Summary, profile: Profile) -> int:
    """The fixed rate both sides of a scenario are timed at: a quarter of what the proxy answered at saturation
    (so that the proxy is timed, not a queue in front of it), at most the profile's rate, at least 20/s."""
    return max(20, min(profile.latency_qps, int(proxy_saturation.answered_per_second * LATENCY_SHARE)))


def _p(latency: Latencies, q: float) -> float:
    return percentile(latency.seconds, q) * 1e6


def report_scenario(report: Report, scenario: str, samples: dict[str, list[Sample]]) -> None:
    proxy, reference = SCENARIOS[scenario]
    ours, theirs = samples[proxy.label], samples[reference.label]
    rates = sorted({s.rate for s in ours})
    rate = f"{proxy.label}; at {', '.join(f'{r:,}' for r in rates)} queries/s"
    servers_note = f"{proxy.label}: {' + '.join(proxy.servers)}"
    figures: list[tuple[str, str, str, Callable[[Sample], float]]] = [
        ("answers/s at saturation", "answers/s", proxy.label, lambda s: s.saturation.answered_per_second),
        ("server CPU per answer at saturation", "µs", servers_note, lambda s: s.cpu_per_answer),
        ("p50 latency at a fixed rate", "µs", rate, lambda s: _p(s.latency, 50)),
        ("p99 latency at a fixed rate", "µs", rate, lambda s: _p(s.latency, 99)),
    ]
    for metric, unit, note, figure in figures:
        value, ref = median([figure(s) for s in ours]), median([figure(s) for s in theirs])
        report.add(Measurement(scenario, metric, value, unit, ref, reference.label, note=note))
    sent = sum(s.saturation.sent + len(s.latency.seconds) + s.latency.timeouts for s in ours)
    lost = sum(s.saturation.lost + s.latency.timeouts for s in ours)
    other: Counter[str] = Counter()
    for s in ours:
        other.update(s.saturation.rcodes)
        other.update(s.latency.rcodes)
    del other["NOERROR"]
    if lost or other:
        codes = "".join(f", {count} {code}" for code, count in sorted(other.items()))
        report.notes.append(f"{scenario}: of {sent:,} queries to the proxy, {lost} got no answer in 1 s{codes}.")


NOTES = (
    "Loopback, in a private network namespace; dnsperf 2.10 over UDP. Answers/s counts NOERROR answers only.",
    "Latency: dnsperf's own per-response times (one client) at a fixed rate, the same for both sides: a quarter of "
    "the proxy's saturation rate in that round, at most the profile's; the median over rounds.",
    "The proxy is ambit.dns.server.DnsServer on uvloop as a node proxy runs it per pod; dnsmasq answers from a "
    "hosts file with its cache. In 'forwarded names' the proxy and dnsmasq share the servers' CPU.",
)


def run(profile: Profile, out: Path | None, *, echo: bool = True) -> Report:
    """Every scenario, interleaved round by round; writes dns.md and dns.json to ``out``."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise DnsBenchError(f"missing: {', '.join(missing)} (make install adds dnsperf and dnsmasq-base)")
    if [name for _, name in socket.if_nameindex()] != ["lo"]:
        raise DnsBenchError("refusing to run outside a private network namespace (python -m bench.dns makes one)")
    if Path("/proc/self").resolve().name != str(os.getpid()):
        raise DnsBenchError("/proc is not this PID namespace's (python -m bench.dns mounts its own)")
    report = Report("ambit DNS proxy against dnsmasq", profile.name, notes=list(NOTES))
    started = time.monotonic()

    def log(line: str) -> None:
        if echo:
            print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    load_cpu, server_cpu = _cpus()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True)
    subprocess.run(["ip", "addr", "add", f"{UPSTREAM_IP}/32", "dev", "lo"], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="ambit-bench-dns-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)  # dnsmasq reads its hosts file as nobody
        files = {"mesh": tmp / "mesh.txt", "external": tmp / "external.txt"}
        files["mesh"].write_text(query_file([mesh_name(i, NAMESPACES) for i in range(profile.services)]))
        files["external"].write_text(query_file([external_name(i) for i in range(profile.services)]))
        samples: dict[str, list[Sample]] = {t.label: [] for pair in SCENARIOS.values() for t in pair}
        with servers(tmp, profile, server_cpu) as pids:
            log(f"dnsmasq and the DNS proxy answer ({profile.services} Services)")
            for round_ in range(profile.rounds):
                for pair in SCENARIOS.values():
                    flooded = [saturate(target, files, profile, pids, load_cpu, tmp) for target in pair]
                    rate = latency_rate(flooded[0][0], profile)
                    for target, (summary, used) in zip(pair, flooded, strict=True):
                        sample = Sample(summary, used, pace(target, files, rate, profile, load_cpu, tmp), rate)
                        samples[target.label].append(sample)
                        log(
                            f"round {round_ + 1}: {target.label}: {summary.answered_per_second:,.0f} answers/s; "
                            f"at {rate}/s p50 {_p(sample.latency, 50):.0f} µs, p99 {_p(sample.latency, 99):.0f} µs"
                        )
        for scenario in SCENARIOS:
            report_scenario(report, scenario, samples)
        counters = proxy_counters((tmp / "proxy.log").read_text(errors="replace"))
        if counters:
            report.notes.append("The proxy's own counts at the end: " + "; ".join(counters) + ".")
    report.env["loadavg_end"] = os.getloadavg()[0]
    report.env["seconds"] = round(time.monotonic() - started, 1)
    report.env["services"] = profile.services
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "dns")
        log(f"written: {md} and {js}")
    return report


def proxy_counters(log: str) -> list[str]:
    """The proxy's failure and drop counters from its log (:mod:`bench.dns_proxy` prints them on the way out)."""
    wanted = ("istio_dns_upstream_failures_total", "ambit_dns_dropped_total")
    return [line.strip() for line in log.splitlines() if line.startswith(wanted)]


# -- entry point ----------------------------------------------------------------------------------------------------


def _in_namespaces(argv: list[str]) -> int:
    """Run this module again in a private network and PID namespace (module docstring); its exit status."""
    if shutil.which("unshare") is None:
        print("bench.dns: unshare (util-linux) is missing", file=sys.stderr)
        return 1
    root = os.geteuid() == 0
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"]
    if not root:
        command.append("--map-root-user")
    command += [sys.executable, "-m", "bench.dns", *argv]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = os.environ | {NETNS_ENV: "root" if root else "user", "PYTHONPATH": path}
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted; unshare ignores SIGTERM while it waits: ask the benchmark itself
            for pid in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()  # --kill-child passes it on; the PID namespace's end takes the rest
                proc.wait()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.dns", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_const", const="quick", default="full", dest="profile")
    parser.add_argument("--seconds", type=float, help="each dnsperf run's length (default: the profile's)")
    parser.add_argument("--services", type=int, help="mesh Services, and as many external names (default: 1000)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where dns.md and dns.json go")
    args = parser.parse_args(args_list)
    if args.seconds is not None and not 0 < args.seconds <= 600:
        parser.error("--seconds must be between 0 and 600")
    if args.services is not None and not 1 <= args.services <= 10_000:
        parser.error("--services must be between 1 and 10,000")
    # A SIGTERM (an impatient caller, or unshare passing one on) unwinds like an error: children end, files go.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if NETNS_ENV not in os.environ:
        return _in_namespaces(args_list)
    profile = PROFILES[args.profile]
    if args.seconds is not None:
        profile = replace(profile, saturation_seconds=args.seconds, latency_seconds=args.seconds)
    if args.services is not None:
        profile = replace(profile, services=args.services)
    try:
        run(profile, args.out)
    except (AmbitError, OSError, subprocess.SubprocessError) as exc:
        print(f"bench.dns: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
