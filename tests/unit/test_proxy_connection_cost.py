"""The shortcuts the node proxy takes per new connection (issue 7) give exactly what the long way gave.

Each test pins one shortcut against the plain computation it replaced: the one-pass access-log text against the
field-by-field rules, ``ConnectionRecord.ended`` against ``dataclasses.replace``, the labels cache against
``traffic_labels``, the cached log timestamp against the standard formatter.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging

from hypothesis import given
from hypothesis import strategies as st

from ambit.cli.process_logging import LOG_FORMAT, LogFormatter
from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import parse_authority
from ambit.model.identity import SpiffeId
from ambit.model.workload import Service, Workload
from ambit.proxy.accounting import LabelsCache, traffic_labels
from ambit.proxy.plans import _split_authority
from ambit.telemetry.accesslog import ConnectionRecord, format_access_log
from ambit.telemetry.metrics import ProxyMetrics, Reporter

_STRING_KEYS = (
    ("src.addr", "src_addr"),
    ("src.workload", "src_workload"),
    ("src.namespace", "src_namespace"),
    ("src.identity", "src_identity"),
    ("src.cluster", "src_cluster"),
    ("dst.addr", "dst_addr"),
    ("dst.hbone_addr", "dst_hbone_addr"),
    ("dst.service", "dst_service"),
    ("dst.workload", "dst_workload"),
    ("dst.namespace", "dst_namespace"),
    ("dst.identity", "dst_identity"),
    ("dst.cluster", "dst_cluster"),
)


def _quoted(value: str) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)


def _reference_text(record: ConnectionRecord) -> str:
    """The access-log text rules, field by field, as the module docstring states them."""
    fields: list[tuple[str, str | int]] = [(k, getattr(record, a)) for k, a in _STRING_KEYS if getattr(record, a)]
    if record.direction:
        fields.append(("direction", record.direction))
    fields += [("bytes_sent", record.bytes_sent), ("bytes_recv", record.bytes_recv)]
    fields.append(("duration", f"{round(max(record.duration_seconds, 0.0) * 1000)}ms"))
    if record.error:
        fields.append(("error", record.error))
    out = ["connection failed" if record.error else "connection complete"]
    for key, value in fields:
        if isinstance(value, int):
            out.append(f"{key}={value}")
        elif key in ("direction", "duration", "error") or not value.isprintable() or set(value) & set(' \t\r\n"=\\'):
            out.append(f"{key}={_quoted(value)}")
        else:
            out.append(f"{key}={value}")
    return " ".join(out)


_texts = st.one_of(st.just(""), st.text(max_size=12), st.sampled_from(["web-0", "a b", 'q"', "x=y", "\u2028", "é"]))
_records = st.builds(
    ConnectionRecord,
    direction=st.one_of(st.sampled_from(["outbound", "inbound", ""]), st.text(max_size=8)),
    src_addr=_texts,
    dst_addr=_texts,
    dst_hbone_addr=_texts,
    src_workload=_texts,
    src_namespace=_texts,
    src_identity=_texts,
    src_cluster=_texts,
    dst_service=_texts,
    dst_workload=_texts,
    dst_namespace=_texts,
    dst_identity=_texts,
    dst_cluster=_texts,
    bytes_sent=st.integers(min_value=0, max_value=2**40),
    bytes_recv=st.integers(min_value=0, max_value=2**40),
    duration_seconds=st.floats(min_value=-1.0, max_value=1e6, allow_nan=False),
    error=_texts,
)


@given(_records)
def test_the_one_pass_text_line_is_the_field_by_field_line(record: ConnectionRecord) -> None:
    assert format_access_log(record) == _reference_text(record)


@given(_records)
def test_ended_is_replace_with_the_outcome(record: ConnectionRecord) -> None:
    outcome = {"bytes_sent": 7, "bytes_recv": 9, "duration_seconds": 0.25, "error": "reset"}
    assert record.ended(**outcome) == dataclasses.replace(record, **outcome)


def _workload(name: str) -> Workload:
    return Workload(f"Kubernetes//Pod/apps/{name}", name, "apps", (ipaddress.ip_address("198.18.200.9"),))


def test_the_labels_cache_gives_the_shared_labels_of_traffic_labels_with_the_destination_identity() -> None:
    metrics = ProxyMetrics()
    cache = LabelsCache(metrics)
    source, destination = _workload("web-0"), _workload("db-0")
    service = Service("db", "apps", "db.apps.svc.cluster.local")
    peer = SpiffeId("cluster.local", "apps", "web")
    for mtls in (True, False):
        labels = cache.labels(
            Reporter.SOURCE, source=source, source_identity=peer, destination=destination, service=service, mtls=mtls
        )
        expected = traffic_labels(
            Reporter.SOURCE,
            source=source,
            source_identity=peer,
            destination=destination,
            destination_identity=destination.identity,
            service=service,
            mtls=mtls,
        )
        assert labels == expected
        assert labels is metrics.shared_labels(expected)
        again = cache.labels(
            Reporter.SOURCE, source=source, source_identity=peer, destination=destination, service=service, mtls=mtls
        )
        assert again is labels


def test_the_labels_cache_starts_afresh_at_its_limit_and_still_answers() -> None:
    metrics = ProxyMetrics()
    cache = LabelsCache(metrics, limit=2)
    workloads = [_workload(f"w-{i}") for i in range(5)]
    for workload in workloads:
        labels = cache.labels(
            Reporter.DESTINATION, source=None, source_identity=None, destination=workload, service=None, mtls=False
        )
        assert labels.destination_workload == workload.name
        assert len(cache._entries) <= 2


def test_the_log_formatter_writes_what_the_standard_formatter_writes() -> None:
    ours, standard = LogFormatter(), logging.Formatter(LOG_FORMAT)
    for created in (1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_001.25, 1_700_003_600.0):
        record = logging.LogRecord("access", logging.INFO, __file__, 1, "line %s", ("x",), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == standard.format(record)


def _parsed(authority: str, local_ip: str | None = None) -> tuple[str, int] | str:
    try:
        return _split_authority(authority, local_ip) if local_ip is not None else parse_authority(authority)
    except AuthorityError:
        return "refused"


_LOCAL_IPS = st.sampled_from(["198.18.200.2", "10.0.0.1", "fd00::2"])
_ODD_PORTS = ["", "08080", "\uff18\uff10", "+80"]  # empty, a leading zero, full-width digits, a sign
_PORT_TEXTS = st.one_of(st.integers(min_value=0, max_value=70000).map(str), st.sampled_from(_ODD_PORTS))


@given(_LOCAL_IPS, st.one_of(_LOCAL_IPS, st.sampled_from(["[fd00::2]", "198.18.200.02", "echo.apps", ""])), _PORT_TEXTS)
def test_the_authority_shortcut_agrees_with_parse_authority(local_ip: str, host: str, port: str) -> None:
    authority = f"{host}:{port}"
    assert _parsed(authority, local_ip) == _parsed(authority)
