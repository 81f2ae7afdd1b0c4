"""What a node proxy knows, as tables: ``ambit proxy-config`` from the admin ``/config_dump`` (spec §8.2).

Theory of operation: pure. :func:`read_config_dump` checks the JSON text a proxy's admin port answered and keeps the
document; :func:`build_table` turns one of its sections into a :class:`Table` with the columns ``istioctl
ztunnel-config`` prints, :func:`select_entries` picks the same entries in the dump's own shape for ``-o json|yaml``,
and :func:`render_text` / :func:`render_structured` make the text to print. The clock is passed in (``now``, for
whether a certificate is valid).

Rules:

1. The dump is untrusted input (``--admin-url`` can point anywhere): every field a view reads is checked, and a
   missing or mistyped one raises :class:`ConfigDumpError` naming its path (``workloads[2].workloadIps[0]: expected
   a string, got 7``). Nothing else escapes. Fields no view reads are not checked, and unknown keys are ignored (a
   newer proxy may add some).
2. A section the dump lacks is an error only when a view needs it: a waypoint's dump has no ``pods`` and
   ``connections``, and ``workloads`` of a waypoint still works.
3. Columns and orders are istioctl's: workloads NAMESPACE, POD NAME, ADDRESS, NODE, WAYPOINT, PROTOCOL by
   namespace, name, node; services NAMESPACE, SERVICE NAME, SERVICE VIP, WAYPOINT, ENDPOINTS by namespace, name,
   hostname; policies NAMESPACE, POLICY NAME, ACTION, SCOPE by namespace, name; certificates CERTIFICATE NAME, TYPE,
   STATUS, VALID CERT, SERIAL NUMBER, NOT AFTER, NOT BEFORE in the dump's order, one row per certificate (Leaf, then
   Intermediate, then Root); connections WORKLOAD, DIRECTION, LOCAL, REMOTE, AGE by workload, direction, age.
4. A waypoint is named by its Service's name (found by hostname and namespace, or by VIP), else by the workload at
   its address, else by what the dump says; no waypoint is ``None``. A service with ``weightedWaypoints`` (a
   canary waypoint) shows its waypoint, then in parentheses each of that set with its share of new connections:
   ``waypoint(waypoint=90%,canary=10%)``, one word as istioctl's cell is. ENDPOINTS is healthy/all workloads whose
   ``services`` name the service (``namespace/hostname``).
5. Connection addresses are shown as ``service-hostname:port`` or ``pod.namespace:port`` when the dump knows the
   IP, unless ``raw``; LOCAL is the proxy's side (the destination of an inbound connection, the source of an
   outbound one).
6. Filters compare case-insensitively, as istioctl's do; they apply to tables and structured output alike.
7. Text output never carries control characters from the dump: they are shown as ``\\x1b`` escapes, so a hostile
   dump cannot drive the terminal. JSON and YAML output escape them by construction.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ambit.errors import AmbitError

__all__ = [
    "ConfigDumpError",
    "Filters",
    "ProxyConfigError",
    "Section",
    "Table",
    "build_table",
    "read_config_dump",
    "render_structured",
    "render_text",
    "select_entries",
]


class ProxyConfigError(AmbitError):
    """``ambit proxy-config`` could not show a proxy's configuration."""


class ConfigDumpError(ProxyConfigError):
    """The proxy's ``/config_dump`` is not what a node proxy sends (the peer's fault): names the field."""


class Section(enum.Enum):
    WORKLOADS = "workloads"
    SERVICES = "services"
    POLICIES = "policies"
    CERTIFICATES = "certificates"
    CONNECTIONS = "connections"


@dataclass(frozen=True, slots=True)
class Filters:
    """What the user narrowed the view to; empty strings match everything (rule 6)."""

    namespace: str = ""
    address: str = ""
    """Workloads with this IP among their addresses."""
    direction: str = ""
    """Connections: ``inbound`` or ``outbound``."""
    raw: bool = False
    """Connections: addresses as they are, not looked up (rule 5)."""


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


# --- reading (rule 1) --------------------------------------------------------------------------------------------


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return _printable(text if len(text) <= 40 else text[:37] + "...")


def _fail(path: str, expected: str, value: object) -> ConfigDumpError:
    return ConfigDumpError(f"config_dump {path}: expected {expected}, got {_describe(value)}")


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "an object", value)
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, "a list", value)
    return value


def _string(obj: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    if key not in obj and default is not None:
        return default
    if key not in obj:
        raise ConfigDumpError(f"config_dump {path}: no {key!r}")
    value = obj[key]
    if not isinstance(value, str):
        raise _fail(f"{path}.{key}", "a string", value)
    return value


def _strings(obj: Mapping[str, Any], key: str, path: str) -> list[str]:
    items = _list(obj.get(key, []), f"{path}.{key}")
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise _fail(f"{path}.{key}[{index}]", "a string", item)
    return items


def _entries(dump: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    if section not in dump:
        raise ConfigDumpError(f"config_dump has no {section!r} section (is this a node proxy's admin port?)")
    return [_mapping(item, f"{section}[{i}]") for i, item in enumerate(_list(dump[section], section))]


def read_config_dump(text: str | bytes) -> dict[str, Any]:
    """The dump as a JSON object; :class:`ConfigDumpError` for anything else (the sections are checked when read)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigDumpError(f"config_dump is not JSON: {str(exc)[:200]}") from None
    if not isinstance(document, dict):
        raise _fail("(top level)", "an object", document)
    return document


_Row = tuple[Mapping[str, Any], tuple[str, ...]]
"""A dump entry and the table row it gives."""


# --- the views ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Index:
    """Names of things by address and hostname, from the dump's workloads and services (rules 4 and 5)."""

    service_by_host: dict[tuple[str, str], str]
    service_by_vip: dict[str, str]
    hostname_by_ip: dict[str, str]
    workload_by_ip: dict[str, tuple[str, str]]
    """IP → (name, namespace)."""


def _index(dump: Mapping[str, Any]) -> _Index:
    by_host: dict[tuple[str, str], str] = {}
    by_vip: dict[str, str] = {}
    hostname_by_ip: dict[str, str] = {}
    for i, svc in enumerate(_entries(dump, "services")):
        path = f"services[{i}]"
        name, namespace = _string(svc, "name", path), _string(svc, "namespace", path)
        hostname = _string(svc, "hostname", path)
        by_host.setdefault((namespace, hostname), name)
        for vip in _strings(svc, "vips", path):
            by_vip.setdefault(vip, name)
            hostname_by_ip.setdefault(vip.rpartition("/")[2], hostname)
    by_ip: dict[str, tuple[str, str]] = {}
    for i, wl in enumerate(_entries(dump, "workloads")):
        path = f"workloads[{i}]"
        known = (_string(wl, "name", path), _string(wl, "namespace", path))
        for ip in _strings(wl, "workloadIps", path):
            by_ip.setdefault(ip, known)
    return _Index(by_host, by_vip, hostname_by_ip, by_ip)


def _waypoint_name(entry: Mapping[str, Any], path: str, index: _Index, key: str = "waypoint") -> str:
    if entry.get(key) is None:
        return "None"
    waypoint = _mapping(entry[key], f"{path}.{key}")
    if "address" in waypoint:
        address = _string(waypoint, "address", f"{path}.{key}")
        ip = address.rpartition("/")[2]
        workload = index.workload_by_ip.get(ip)
        return index.service_by_vip.get(address) or (workload[0] if workload else address)
    hostname = _string(waypoint, "hostname", f"{path}.{key}")
    namespace = _string(waypoint, "namespace", f"{path}.{key}")
    return index.service_by_host.get((namespace, hostname), hostname)


def _service_waypoints(svc: Mapping[str, Any], path: str, index: _Index) -> str:
    """The WAYPOINT cell of a service: its waypoint, then its weighted set if it has one (rule 4)."""
    shown = _waypoint_name(svc, path, index)
    weighted = _list(svc.get("weightedWaypoints", []), f"{path}.weightedWaypoints")
    shares: list[str] = []
    for i, item in enumerate(weighted):
        at = f"{path}.weightedWaypoints[{i}]"
        entry = _mapping(item, at)
        if entry.get("destination") is None:
            raise ConfigDumpError(f"config_dump {at}: no 'destination'")
        weight = entry.get("weight", 0)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            raise _fail(f"{at}.weight", "a percentage (0 to 100)", weight)
        shares.append(f"{_waypoint_name(entry, at, index, 'destination')}={weight}%")
    return f"{shown}({','.join(shares)})" if shares else shown


def _matches(value: str, wanted: str) -> bool:
    return not wanted or value.casefold() == wanted.casefold()


def _workload_rows(dump: Mapping[str, Any], filters: Filters) -> list[_Row]:
    index = _index(dump)
    out: list[_Row] = []
    for i, wl in enumerate(_entries(dump, "workloads")):
        path = f"workloads[{i}]"
        ips = _strings(wl, "workloadIps", path)
        namespace = _string(wl, "namespace", path)
        if not _matches(namespace, filters.namespace):
            continue
        if filters.address and not any(_matches(ip, filters.address) for ip in ips):
            continue
        row = (
            namespace,
            _string(wl, "name", path),
            ",".join(ips),
            _string(wl, "node", path, ""),
            _waypoint_name(wl, path, index),
            _string(wl, "protocol", path, "TCP"),
        )
        out.append((wl, row))
    out.sort(key=lambda pair: (pair[1][0], pair[1][1], pair[1][3]))
    return out


def _endpoint_counts(dump: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for i, wl in enumerate(_entries(dump, "workloads")):
        path = f"workloads[{i}]"
        healthy = _string(wl, "status", path, "Healthy") == "Healthy"
        for key in _mapping(wl.get("services", {}), f"{path}.services"):
            good, total = counts.get(key, (0, 0))
            counts[key] = (good + healthy, total + 1)
    return counts


def _service_rows(dump: Mapping[str, Any], filters: Filters) -> list[_Row]:
    index = _index(dump)
    counts = _endpoint_counts(dump)
    keyed: list[tuple[tuple[str, str, str], _Row]] = []
    for i, svc in enumerate(_entries(dump, "services")):
        path = f"services[{i}]"
        namespace, hostname = _string(svc, "namespace", path), _string(svc, "hostname", path)
        if not _matches(namespace, filters.namespace):
            continue
        healthy, total = counts.get(f"{namespace}/{hostname}", (0, 0))
        vips = ",".join(vip.rpartition("/")[2] for vip in _strings(svc, "vips", path))
        row = (namespace, _string(svc, "name", path), vips, _service_waypoints(svc, path, index), f"{healthy}/{total}")
        keyed.append(((namespace, row[1], hostname), (svc, row)))
    keyed.sort(key=lambda pair: pair[0])
    return [row for _key, row in keyed]


def _policy_rows(dump: Mapping[str, Any], filters: Filters) -> list[_Row]:
    out: list[_Row] = []
    for i, policy in enumerate(_entries(dump, "policies")):
        path = f"policies[{i}]"
        namespace = _string(policy, "namespace", path)
        if not _matches(namespace, filters.namespace):
            continue
        name, action = _string(policy, "name", path), _string(policy, "action", path)
        row = (namespace, name, action, _string(policy, "scope", path))
        out.append((policy, row))
    out.sort(key=lambda pair: (pair[1][0], pair[1][1]))
    return out


_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def _moment(cert: Mapping[str, Any], key: str, path: str) -> datetime.datetime:
    text = _string(cert, key, path)
    if not _RFC3339.fullmatch(text):
        raise _fail(f"{path}.{key}", "an RFC 3339 time", text)
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _fail(f"{path}.{key}", "an RFC 3339 time", text) from None


def _certificate_rows(dump: Mapping[str, Any], now: float) -> list[_Row]:
    out: list[_Row] = []
    for i, entry in enumerate(_entries(dump, "certificates")):
        path = f"certificates[{i}]"
        identity = _string(entry, "identity", path)
        state = _string(entry, "state", path)
        state = "Unavailable" if state.startswith("Unavailable") else state  # the reason is in -o json
        chain = _list(entry.get("certChain", []), f"{path}.certChain")
        roots = _list(entry.get("rootCerts", []), f"{path}.rootCerts")
        if not chain:
            out.append((entry, (identity, "NA", state, "false", "NA", "NA", "NA")))
            continue
        kinds = ["Leaf" if n == 0 else "Intermediate" for n in range(len(chain))] + ["Root"] * len(roots)
        certs = [(f"{path}.certChain[{n}]", c) for n, c in enumerate(chain)]
        certs += [(f"{path}.rootCerts[{n}]", c) for n, c in enumerate(roots)]
        for kind, (cert_path, value) in zip(kinds, certs, strict=True):
            cert = _mapping(value, cert_path)
            not_before, not_after = _moment(cert, "validFrom", cert_path), _moment(cert, "expirationTime", cert_path)
            valid = not_before.timestamp() <= now < not_after.timestamp()
            serial = _string(cert, "serialNumber", cert_path)
            row = (identity, kind, state, str(valid).lower(), serial, cert["expirationTime"], cert["validFrom"])
            out.append((entry, row))
    return out


def _split_hostport(address: str) -> tuple[str, str] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), port


def _connection_rows(dump: Mapping[str, Any], filters: Filters) -> list[_Row]:
    pods: dict[str, tuple[str, str]] = {}
    for i, pod in enumerate(_entries(dump, "pods")):
        path = f"pods[{i}]"
        pods[_string(pod, "uid", path)] = (_string(pod, "name", path), _string(pod, "namespace", path))
    index = _index(dump)

    def name(address: str) -> str:
        split = None if filters.raw else _split_hostport(address)
        if split is None:
            return address
        host, port = split
        if (hostname := index.hostname_by_ip.get(host)) is not None:
            return f"{hostname}:{port}"
        if (workload := index.workload_by_ip.get(host)) is not None:
            return f"{workload[0]}.{workload[1]}:{port}"
        return address

    keyed: list[tuple[tuple[str, str, float], _Row]] = []
    for i, conn in enumerate(_entries(dump, "connections")):
        path = f"connections[{i}]"
        direction = _string(conn, "direction", path)
        if not _matches(direction, filters.direction):
            continue
        pod_uid = _string(conn, "pod", path)
        pod_name, pod_namespace = pods.get(pod_uid, (pod_uid, ""))
        if not _matches(pod_namespace, filters.namespace):
            continue
        src, dst = _string(conn, "src", path), _string(conn, "dst", path)
        local, remote = (dst, src) if direction == "inbound" else (src, dst)
        age = conn.get("ageSeconds", 0)
        if isinstance(age, bool) or not isinstance(age, int | float) or not math.isfinite(age):
            raise _fail(f"{path}.ageSeconds", "a number", age)
        workload = f"{pod_name}.{pod_namespace}" if pod_namespace else pod_name
        row = (workload, direction.capitalize(), name(local), name(remote), _age(age))
        keyed.append(((workload, row[1], -float(age)), (conn, row)))
    keyed.sort(key=lambda pair: pair[0])
    return [row for _key, row in keyed]


def _age(seconds: float) -> str:
    """kubectl's short form: 45s, 12m, 3h, 2d."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


_COLUMNS: dict[Section, tuple[str, ...]] = {
    Section.WORKLOADS: ("NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"),
    Section.SERVICES: ("NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS"),
    Section.POLICIES: ("NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"),
    Section.CERTIFICATES: (
        "CERTIFICATE NAME",
        "TYPE",
        "STATUS",
        "VALID CERT",
        "SERIAL NUMBER",
        "NOT AFTER",
        "NOT BEFORE",
    ),
    Section.CONNECTIONS: ("WORKLOAD", "DIRECTION", "LOCAL", "REMOTE", "AGE"),
}

_Rows = Callable[[Mapping[str, Any], Filters, float], list[_Row]]
_VIEWS: dict[Section, _Rows] = {
    Section.WORKLOADS: lambda dump, filters, now: _workload_rows(dump, filters),
    Section.SERVICES: lambda dump, filters, now: _service_rows(dump, filters),
    Section.POLICIES: lambda dump, filters, now: _policy_rows(dump, filters),
    Section.CERTIFICATES: lambda dump, filters, now: _certificate_rows(dump, now),
    Section.CONNECTIONS: lambda dump, filters, now: _connection_rows(dump, filters),
}


def build_table(dump: Mapping[str, Any], section: Section, filters: Filters, *, now: float) -> Table:
    """``section`` of ``dump`` as istioctl's table (rule 3); :class:`ConfigDumpError` when the dump is malformed."""
    rows = tuple(row for _entry, row in _VIEWS[section](dump, filters, now))
    return Table(section.value, _COLUMNS[section], rows)


def select_entries(dump: Mapping[str, Any], section: Section, filters: Filters) -> list[Any]:
    """The dump's own entries behind :func:`build_table`'s rows, in the same order, each once."""
    picked: list[Any] = []
    for entry, _row in _VIEWS[section](dump, filters, 0.0):
        if not picked or picked[-1] is not entry:  # a certificate entry gives one row per certificate
            picked.append(entry)
    return picked


# --- rendering (rule 7) ------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(cell: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", cell)


def render_text(tables: list[Table], *, titles: bool = False) -> str:
    """Columns left-aligned, padded to the widest cell plus one space as istioctl's tabwriter does; with
    ``titles``, each table is headed by its name and tables are separated by a blank line."""
    blocks = []
    for table in tables:
        cells = [table.columns, *(tuple(_printable(c) for c in row) for row in table.rows)]
        widths = [max(len(row[n]) for row in cells) for n in range(len(table.columns))]
        lines = [" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        if titles:
            lines.insert(0, f"{table.title.upper()}:")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def render_structured(value: Any, output: str) -> str:
    """``value`` as ``json`` (indented, ASCII) or ``yaml`` (non-printables escaped)."""
    if output == "json":
        return json.dumps(value, indent=2, ensure_ascii=True) + "\n"
    if output == "yaml":
        return yaml.safe_dump(value, sort_keys=False, allow_unicode=False)
    raise ValueError(f"unknown structured output {output!r}")
