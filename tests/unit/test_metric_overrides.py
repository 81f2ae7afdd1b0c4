"""Metric-override expressions (ambit.model.metric_overrides) and their codec (ambit.xds.metric_overrides,
WaypointConfig field 7): the parser accepts exactly its subset and never raises anything but ExpressionError
(hypothesis), evaluation reads the request, model → proto → model is the identity, bad entries are refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.api import metric_overrides_pb2 as mpb
from ambit.api import waypoint_pb2 as pb
from ambit.model.metric_overrides import (
    MAX_EXPRESSION,
    Attribute,
    Expression,
    ExpressionError,
    IstioMetric,
    MetricOverride,
    RequestAttributes,
    ServiceMetrics,
    TagOverride,
    evaluate,
    parse_expression,
    tag_name_problem,
)
from ambit.model.routes import WaypointConfig
from ambit.xds.errors import XdsConversionError
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

NAME = "app/waypoint"
REQUEST = RequestAttributes(
    method="GET",
    path="/a/b?x=1",
    host="reviews:9080",
    headers=(("x-user", "alice"), ("user-agent", "curl"), ("x-user", "bob")),
    response_code=200,
    source_address="10.0.0.1",
    source_port=43122,
    source_principal="spiffe://cluster.local/ns/app/sa/client",
    destination_port=9080,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'test'", "test"),
        ('"test"', "test"),
        ("  'a\\'b'  ", "a'b"),
        ("'tab\\there'", "tab\there"),
        ("request.headers['X-User']", "alice"),
        ('request.headers["absent"]', ""),
        ("request.host", "reviews:9080"),
        ("request.method", "GET"),
        ("request.path", "/a/b?x=1"),
        ("request.url_path", "/a/b"),
        ("request.useragent", "curl"),
        ("response.code", "200"),
        ("source.address", "10.0.0.1"),
        ("source.port", "43122"),
        ("source.principal", "spiffe://cluster.local/ns/app/sa/client"),
        ("destination.port", "9080"),
        ("destination.principal", ""),
    ],
)
def test_supported_expressions_evaluate_against_the_request(text: str, value: str) -> None:
    assert evaluate(parse_expression(text), REQUEST) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("'a' + 'b'", "single string literal"),
        ("'open", "unterminated"),
        ("'\\q'", "unsupported escape"),
        ("request.auth.claims['sub']", "unsupported expression"),
        ("request.headers[x]", "quoted header name"),
        ("request.headers['']", "one non-empty"),
        ("upstream_peer.labels['app'].value", "unsupported expression"),
        ("has(request.host)", "unsupported expression"),
        ("'" + "a" * MAX_EXPRESSION + "'", "longer than"),
    ],
)
def test_other_expressions_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(ExpressionError, match=reason):
        parse_expression(text)


@given(st.text(max_size=200))
def test_the_parser_accepts_or_refuses_any_text_and_keeps_the_source(text: str) -> None:
    try:
        expression = parse_expression(text)
    except ExpressionError as exc:
        assert exc.reason
    else:
        assert expression.source == text and parse_expression(expression.source) == expression


@given(st.text(max_size=100))
def test_every_string_literal_reads_back_its_value(value: str) -> None:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "")
    expected = value.replace("\r", "")
    assert parse_expression(f"'{escaped}'") == Expression(f"'{escaped}'", Attribute.LITERAL, expected)


LABEL = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True).filter(lambda n: tag_name_problem(n) is None)
EXPRESSIONS = st.sampled_from(["'test'", "request.host", "request.headers['x-a']", "source.principal"])
tags = st.lists(
    st.builds(TagOverride, LABEL, st.one_of(st.none(), EXPRESSIONS.map(parse_expression))),
    max_size=4,
    unique_by=lambda t: t.name,
).map(lambda items: tuple(sorted(items, key=lambda t: t.name)))
overrides = st.lists(
    st.builds(MetricOverride, st.sampled_from(IstioMetric), st.booleans(), tags),
    max_size=4,
    unique_by=lambda o: o.metric,
).map(tuple)
entries = st.lists(
    st.builds(
        ServiceMetrics,
        st.one_of(st.just(""), LABEL.map(lambda n: f"app/{n}.app.svc.cluster.local")),
        st.booleans(),
        overrides,
    ),
    max_size=3,
    unique_by=lambda e: e.service_key,
).map(tuple)


def decode(message: pb.WaypointConfig) -> WaypointConfig:
    return decode_waypoint_config(NAME, pack_waypoint_config(message))


@given(entries)
def test_model_to_proto_and_back_is_the_identity(metrics: tuple[ServiceMetrics, ...]) -> None:
    config = WaypointConfig(NAME, metrics=metrics)
    assert decode(waypoint_config_to_proto(config)) == config


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (mpb.ServiceMetrics(overrides=[mpb.MetricOverride(metric="NOPE")]), "metrics[0].overrides[0].metric"),
        (
            mpb.ServiceMetrics(
                overrides=[mpb.MetricOverride(metric="REQUEST_COUNT", tags=[mpb.TagOverride(name="a-b")])]
            ),
            "metrics[0].overrides[0].tags[0].name",
        ),
        (
            mpb.ServiceMetrics(
                overrides=[mpb.MetricOverride(metric="REQUEST_COUNT", tags=[mpb.TagOverride(name="a", value="a+b")])]
            ),
            "metrics[0].overrides[0].tags[0].value",
        ),
        (
            mpb.ServiceMetrics(
                overrides=[
                    mpb.MetricOverride(
                        metric="REQUEST_COUNT", tags=[mpb.TagOverride(name="a", remove=True, value="'x'")]
                    )
                ]
            ),
            "metrics[0].overrides[0].tags[0].value",
        ),
        (
            mpb.ServiceMetrics(
                overrides=[
                    mpb.MetricOverride(
                        metric="REQUEST_COUNT", tags=[mpb.TagOverride(name=f"t{i}", remove=True) for i in range(65)]
                    )
                ]
            ),
            "metrics[0].overrides[0].tags",
        ),
        (
            mpb.ServiceMetrics(overrides=[mpb.MetricOverride(metric="REQUEST_COUNT")] * 2),
            "metrics[0].overrides",
        ),
        (mpb.ServiceMetrics(service_key="a\nb"), "metrics[0].service_key"),
        (
            mpb.ServiceMetrics(
                overrides=[mpb.MetricOverride(metric="REQUEST_SIZE", tags=[mpb.TagOverride(name="le", remove=True)])]
            ),
            "metrics[0].overrides[0].tags[0].name",
        ),
    ],
)
def test_bad_entries_are_refused_by_name(entry: mpb.ServiceMetrics, field: str) -> None:
    with pytest.raises(XdsConversionError) as caught:
        decode(pb.WaypointConfig(waypoint=NAME, metrics=[entry]))
    assert caught.value.field == field


def test_a_service_key_twice_is_refused() -> None:
    with pytest.raises(XdsConversionError, match="twice"):
        decode(pb.WaypointConfig(waypoint=NAME, metrics=[mpb.ServiceMetrics(), mpb.ServiceMetrics()]))
