"""The Go text/template subset of the injection templates: one table row per construct, the errors, the bounds,
and hypothesis on the parser and evaluator (any text gives output or a TemplateError, nothing else)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.gateway.gotemplate import Message, TemplateError, render
from ambit.controlplane.gateway.gotemplate.execute import MAX_ITERATIONS, MAX_OUTPUT, MAX_STEPS, MAX_WORK
from ambit.controlplane.gateway.gotemplate.parse import MAX_NESTING

DATA: dict[str, Any] = {
    "Name": "wp",
    "Namespace": "ns",
    "Count": 3,
    "Zero": 0,
    "Empty": "",
    "Flag": True,
    "List": ["a", "b"],
    "Map": {"b": "2", "a": "1"},
    "Labels": {"topology.istio.io/network": "net1", "app": "x"},
    "ObjectMeta": {"Annotations": {"sidecar.istio.io/logLevel": "debug"}},
    "Values": {"global": {"proxy": {"image": "proxyv2"}, "waypoint": {"resources": {"cpu": "1", "mem": None}}}},
    "ProxyConfig": Message({"interceptionMode": "REDIRECT", "proxyMetadata": {"B": "2", "A": "1"}}),
    "Ports": [{"Name": "status-port", "Port": 15021}, {"Name": "mesh", "Port": 15008}],
    "Spec": {"Addresses": [{"Value": "10.0.0.1"}]},
}

CASES = [
    # text, actions, trim markers, comments
    ("plain text", "plain text"),
    ("a {{ .Name }} b", "a wp b"),
    ("a   {{- .Name -}}   b", "awpb"),
    ("a\n  {{- .Name }}\n", "awp\n"),
    ("{{-3}}", "-3"),
    ("x{{/* a comment */}}y", "xy"),
    ("x  {{- /* a comment */ -}}  y", "xy"),
    # fields, chains, missing keys, dot, $
    ("{{ .Values.global.proxy.image }}", "proxyv2"),
    ("{{ .Values.nothing.here }}", "<no value>"),
    ("{{ .Missing }}", "<no value>"),
    ("{{ with .Map }}{{ .a }}{{ $.Name }}{{ end }}", "1wp"),
    ("{{ .ProxyConfig.InterceptionMode.String }}", "REDIRECT"),
    ("{{ (index .Spec.Addresses 0).Value | quote }}", '"10.0.0.1"'),
    ("{{ (.Values.pilot).env }}", "<no value>"),
    # literals
    ('{{ "a\\tb\\u00e9" }}', "a\tbé"),
    ("{{ `raw\\n` }}", "raw\\n"),
    ("{{ 42 }} {{ 1.5 }} {{ 0x10 }} {{ true }} {{ nil | quote }}", "42 1.5 16 true "),
    ("{{ 'a' }}", "97"),
    # variables
    ("{{ $x := .Name }}{{ $x }}", "wp"),
    ("{{ $x := 1 }}{{ $x = 2 }}{{ $x }}", "2"),
    ("{{ $n := valueOrDefault (index .Labels `topology.istio.io/network`) `none` }}{{ $n }}", "net1"),
    # if / else if / else
    ("{{ if .Flag }}y{{ else }}n{{ end }}", "y"),
    ("{{ if .Zero }}a{{ else if .Empty }}b{{ else if .Count }}c{{ else }}d{{ end }}", "c"),
    ("{{ if .Missing }}a{{ else }}b{{ end }}", "b"),
    ("{{ if and .Spec.Addresses (eq .Name `wp`) }}lb{{ end }}", "lb"),
    ('{{ if not (eq .Values.revision "") }}rev{{ else }}none{{ end }}', "rev"),  # missing is not ""
    # range
    ("{{ range .List }}[{{ . }}]{{ end }}", "[a][b]"),
    ("{{ range $i, $v := .List }}{{ $i }}={{ $v }} {{ end }}", "0=a 1=b "),
    ("{{ range $k, $v := .Map }}{{ $k }}={{ $v }},{{ end }}", "a=1,b=2,"),
    ("{{ range $key, $value := .ProxyConfig.ProxyMetadata }}{{ $key }}{{ end }}", "AB"),
    ("{{ range .Missing }}x{{ else }}empty{{ end }}", "empty"),
    ("{{ range 3 }}{{ . }}{{ end }}", "012"),
    (
        "{{ range $key, $val := .Ports }}{{ $val.Name | quote }}:{{ $val.Port }} {{ end }}",
        '"status-port":15021 "mesh":15008 ',
    ),
    # with
    ("{{ with .Missing }}a{{ else }}b{{ end }}", "b"),
    ("{{ with .Values.global.proxy }}{{ .image }}{{ end }}", "proxyv2"),
    # functions
    ('{{ .Name | quote }} {{ quote "a\\"b" }}', '"wp" "a\\"b"'),
    ('{{ .Missing | default "d" }} {{ .Name | default "d" }} {{ .Zero | default 7 }}', "d wp 7"),
    ("{{ toJsonMap (strdict `b` `2` `a` `<1>`) .Map }}", '{"a":"1","b":"2"}'),
    ("{{ toJsonMap (omit .Labels `app`) }}", '{"topology.istio.io/network":"net1"}'),
    ("{{ strdict `a` }}", "map[a:]"),
    ("{{ toYaml .Map | nindent 2 }}", "\n  a: '1'\n  b: '2'\n  "),
    ("{{ toYaml (omitNil .Values.global.waypoint.resources) }}", "cpu: '1'\n"),
    ('{{ indent 2 "a\\nb" }}', "a\n  b"),
    ("{{ annotation .ObjectMeta `sidecar.istio.io/logLevel` `info` }}", "debug"),
    ("{{ annotation .ObjectMeta `sidecar.istio.io/other` `info` }}", "info"),
    ("{{ contains `/` .Values.global.proxy.image }} {{ contains `proxy` .Values.global.proxy.image }}", "false true"),
    ("{{ protoToJSON .ProxyConfig }}", '{"interceptionMode":"REDIRECT","proxyMetadata":{"A":"1","B":"2"}}'),
    ("{{ len .List }} {{ index .List 1 }} {{ index .Map `a` }}", "2 b 1"),
    (
        "{{ eq 1 2 1 }} {{ ne .Name `wp` }} {{ lt 1 2 }} {{ ge 128 128 }} {{ gt `b` `a` }} {{ le 2 1 }}",
        "true false true true true false",
    ),
    ("{{ or .Empty .Name }} {{ and .Name .Zero }} {{ or .Empty }}", "wp 0 "),
    ("{{ hasPrefix `w` .Name }} {{ trimSuffix `p` .Name }} {{ toLower `AB` }} {{ upper `ab` }}", "true w ab AB"),
    ('{{ printf "%s-%d %q" .Name 3 "x" }}', 'wp-3 "x"'),
    ("{{ list 1 `a` | len }} {{ dict `a` 1 | toJson }} {{ hasKey .Map `a` }}", '2 {"a":1} true'),
    ("{{ 1000000.0 }} {{ 1e21 }} {{ .List }} {{ .Map }}", "1000000 1e+21 [a b] map[a:1 b:2]"),
    ('{{ .ProxyUID | default "1337" }}', "1337"),
    ("{{ eq .Missing true }} {{ eq .Missing nil }}", "false true"),
]


@pytest.mark.parametrize(("text", "want"), CASES, ids=[case[0][:50] for case in CASES])
def test_each_construct_evaluates_as_go_does(text: str, want: str) -> None:
    assert render(text, DATA) == want


ERRORS = [
    ("{{ .Name", "line 1 col 1: unclosed action"),
    ("a\n{{ nosuch .Name }}", "line 2 col 4: function 'nosuch' not defined"),
    ("{{ if .Flag }}x{{ nosuch }}{{ end }}", "function 'nosuch' not defined"),
    ("{{ end }}", "unexpected {{end}}"),
    ("{{ if .Flag }}x", "{{if}} has no {{end}}"),
    ("{{ if .Flag }}x{{ else }}y{{ else }}z{{ end }}", "expected {{end}}"),
    ("{{ (.Name }}", "unclosed left paren"),
    ("{{ .Name 1 }}", "can't give argument to non-function .Name"),
    ("{{ .Name | .Namespace }}", "can't give argument to non-function"),
    ("{{ quote .Name.Oops }}", "can't evaluate field Oops in type string"),
    ("{{ $nope }}", "undefined variable '$nope'"),
    ("{{ define `x` }}{{ end }}", "{{define}} is not supported"),
    ("{{ template `x` }}", "{{template}} is not supported"),
    ("{{ eq .Name 1 }}", "incompatible types for comparison"),
    ("{{ lt .List .List }}", "non-comparable type list"),
    ("{{ index .List 5 }}", "index out of range: 5"),
    ("{{ len 3 }}", "len of int"),
    ("{{ not }}", "wrong number of args for not"),
    ('{{ "\\q" }}', "unknown escape sequence"),
    ("{{ 1 2 }}", "can't give argument to non-function 1"),
    ("{{ .Name ; }}", "unexpected ';'"),
    ("{{ range .Name }}{{ end }}", "range can't iterate over wp"),
    ("{{ indent 100000 .Name }}", "indent of 100000 spaces"),
    ("{{ }}", "missing value for command"),
    ("{{/* unclosed", "unclosed comment"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[case[0][:40] for case in ERRORS])
def test_bad_templates_are_a_template_error_naming_the_place(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=None) as caught:
        render(text, DATA)
    assert message in str(caught.value)
    assert str(caught.value).startswith("template: ")


def test_a_range_past_the_iteration_bound_is_refused() -> None:
    text = "{{ range $a := .Rows }}{{ range $b := $.Rows }}x{{ end }}{{ end }}"
    rows = list(range(1000))
    with pytest.raises(TemplateError, match=f"more than {MAX_ITERATIONS} range iterations"):
        render(text, {"Rows": rows})
    with pytest.raises(TemplateError, match="range over 1000000000"):
        render("{{ range 1000000000 }}{{ end }}", {})


def test_output_past_the_bound_is_refused() -> None:
    text = "{{ range .Rows }}{{ $.Big }}{{ end }}"
    with pytest.raises(TemplateError, match=f"output longer than {MAX_OUTPUT}"):
        render(text, {"Rows": list(range(100)), "Big": "x" * 100_000})


def test_commands_past_the_step_bound_are_refused() -> None:
    inner = "{{ $x := 1 }}" * 10
    text = "{{ range .Rows }}" + inner + "{{ end }}"
    with pytest.raises(TemplateError, match=f"more than {MAX_STEPS} commands"):
        render(text, {"Rows": list(range(MAX_ITERATIONS))})


def test_nesting_past_the_bound_is_refused() -> None:
    deep = "{{ if .A }}" * (MAX_NESTING + 1) + "{{ end }}" * (MAX_NESTING + 1)
    with pytest.raises(TemplateError, match=f"nested more than {MAX_NESTING} levels"):
        render(deep, {})
    parens = "{{ " + "(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1) + " }}"
    with pytest.raises(TemplateError, match="nested more than"):
        render(parens, {})
    shallow = "{{ if .A }}" * 10 + "y" + "{{ end }}" * 10
    assert render(shallow, {"A": 1}) == "y"


PIECES = st.sampled_from([
    "{{", "}}", "{{-", "-}}", " ", "\n", ".", ".A", ".A.B", "$", "$x", ":=", "=", "|", "(", ")", ",", '"s"',
    "`r`", "'c'", "1", "-2", "0x1f", "1.5e3", "if", "else", "end", "range", "with", "define", "nil", "true",
    "quote", "default", "eq", "and", "or", "not", "index", "len", "toYaml", "nindent", "indent", "printf",
    "/*", "*/", "text", "\\", '"', "`", "{", "}", "é",
])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_any_token_soup_gives_output_or_a_template_error(text: str) -> None:
    try:
        out = render(text, {"A": {"B": [1, "x"]}, "x": None})
    except TemplateError as exc:
        assert str(exc).startswith("template")
    else:
        assert isinstance(out, str)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_output_or_a_template_error(text: str) -> None:
    with contextlib.suppress(TemplateError):
        render(text, DATA)


def test_functions_that_would_build_a_huge_string_refuse_before_building_it() -> None:
    lines = "\n" * 100_000
    with pytest.raises(TemplateError, match="error calling indent: result of"):
        render("{{ indent 1000 .Lines }}", {"Lines": lines})
    with pytest.raises(TemplateError, match="error calling nindent: result of"):
        render("{{ nindent 1000 .Lines }}", {"Lines": lines})
    with pytest.raises(TemplateError, match="error calling replace: result of"):
        render("{{ replace `a` .Big .Big }}", {"Big": "a" * 100_000})
    with pytest.raises(TemplateError, match="error calling printf: result of"):
        render("{{ printf .Form " + " .Big" * 40 + " }}", {"Form": "%s" * 40, "Big": "a" * 100_000})


def test_expensive_functions_in_a_loop_stop_at_the_work_bound() -> None:
    text = "{{ range .Rows }}{{ $y := toYaml $.Values }}{{ end }}"
    values = {f"key{i}": "v" * 100 for i in range(5000)}
    with pytest.raises(TemplateError, match=f"more than {MAX_WORK} characters in all"):
        render(text, {"Rows": list(range(1000)), "Values": values})


def test_a_variable_declared_in_an_if_is_seen_by_its_else_and_assignments_reach_outer_scopes() -> None:
    assert render("{{ if $x := .Zero }}a{{ else }}{{ $x }}{{ end }}", DATA) == "0"
    assert render("{{ $x := 1 }}{{ if .Flag }}{{ $x = 2 }}{{ $y := 3 }}{{ end }}{{ $x }}", DATA) == "2"
    with pytest.raises(TemplateError, match="undefined variable"):
        render("{{ if .Flag }}{{ $y := 3 }}{{ end }}{{ $y }}", DATA)
