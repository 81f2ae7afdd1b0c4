from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.selectors import (
    FieldOp,
    FieldRequirement,
    FieldSelector,
    field_value,
    label_requirement,
    label_selector_from_spec,
    parse_label_selector,
)
from ambit.model.labels import LabelSelector, Requirement
from ambit.model.labels import Operator as LabelOp

LABELS = {"app": "web", "tier": "front", "app.kubernetes.io/name": "ambit", "empty": "", "n": "5"}


@pytest.mark.parametrize(
    ("text", "selected"),
    [
        ("", True),
        ("   ", True),
        ("app=web", True),
        ("app==web", True),
        ("app = web", True),
        ("app=db", False),
        ("app!=db", True),
        ("app!=web", False),
        ("missing!=x", True),
        ("app in (web,db)", True),
        ("app in(db)", False),
        ("app notin (db, cache)", True),
        ("app notin (web)", False),
        ("missing notin (web)", True),
        ("missing in (web)", False),
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("app=web,tier=front", True),
        ("app=web,tier=back", False),
        ("app.kubernetes.io/name=ambit", True),
        ("empty=", True),
        ("empty in ()", True),
        ("app=", False),
        ("app in (,web)", True),
        ("n>4", True),
        ("n>5", False),
        ("n<6", True),
        ("app>1", False),
        ("missing<1", False),
        (" app in ( web , db ) , ! missing ", True),
    ],
)
def test_label_selector_matching_follows_kubernetes(text: str, selected: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is selected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("app web", "found 'web'"),
        ("app=web db", "expected ',' or end of string"),
        ("!app=web", "found '='"),
        ("app in web", "expected '('"),
        ("app in (web", "found end of string"),
        ("app in (web db)", "found 'db'"),
        ("app=web,", "expected a label key"),
        (",app", "found ','"),
        ("=web", "found '='"),
        ("app=(", "expected a label value"),
        ("app=a=b", "found '='"),
        ("Bad/app=web", "invalid label key 'Bad/app'"),
        ("a/b/c=d", "invalid label key 'a/b/c'"),
        ("-app=web", "invalid label key '-app'"),
        ("app=-web", "invalid label value '-web'"),
        ("app=" + "x" * 64, "invalid label value"),
        ("n>x", "needs an integer"),
        ("n>-1", "invalid label value '-1'"),
    ],
)
def test_invalid_label_selector_is_a_bad_request_naming_the_offending_part(text: str, fragment: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_label_selector(text)
    assert caught.value.code == 400
    assert fragment in caught.value.message


def test_single_value_operators_need_exactly_one_value() -> None:
    with pytest.raises(ApiError, match="exactly one value"):
        label_requirement("app", LabelOp.EQUALS, ["a", "b"])


def test_label_selector_renders_canonically() -> None:
    selector = parse_label_selector("b in (y, x, x), a==1, !c, d, e notin ()")
    assert str(selector) == "b in (x,y),a=1,!c,d,e notin ()"


def test_keywords_are_ordinary_values_after_an_operator() -> None:
    assert parse_label_selector("app=in").matches({"app": "in"})
    assert parse_label_selector("app in (notin, in)").matches({"app": "notin"})


def test_from_spec_combines_match_labels_and_expressions() -> None:
    spec = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "back"]},
            {"key": "legacy", "operator": "DoesNotExist"},
            {"key": "app", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
        ],
    }
    selector = label_selector_from_spec(spec)
    assert selector.matches({"app": "web", "tier": "back"})
    assert not selector.matches({"app": "web", "tier": "back", "legacy": "1"})
    assert not selector.matches({"app": "web", "tier": "middle"})
    assert not selector.matches({"app": "db", "tier": "front"})


@pytest.mark.parametrize("spec", [None, {}, {"matchLabels": {}, "matchExpressions": []}])
def test_absent_or_empty_spec_selects_everything(spec: Any) -> None:
    selector = label_selector_from_spec(spec)
    assert selector.selects_everything
    assert parse_label_selector("") == selector
    assert selector.matches({})


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "'Gt' is not one of"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, "at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}, "list of strings"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "key must be a string"),
        ({"matchExpressions": ["a"]}, "must be an object"),
        ({"matchLabels": {"a": 1}}, "must be a string"),
        ({"matchLabels": {"a b": "c"}}, "invalid label key 'a b'"),
        ({"matchLabels": ["a"]}, "matchLabels must be an object"),
        ({"matchLabels": {"": "a"}}, "name part must not be empty"),
        ({"matchExpressions": {"key": "a"}}, "matchExpressions must be a list"),
        ("app=web", "expected an object"),
    ],
)
def test_invalid_spec_is_a_bad_request(spec: Any, fragment: str) -> None:
    with pytest.raises(ApiError) as caught:
        label_selector_from_spec(spec)
    assert caught.value.code == 400
    assert fragment in caught.value.message


POD = {
    "metadata": {"name": "web-0", "namespace": "default"},
    "spec": {"nodeName": "n1", "hostNetwork": True, "priority": 7},
    "status": {"phase": "Running"},
}
ALLOWED = frozenset({"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.hostNetwork"})


@pytest.mark.parametrize(
    ("text", "selected"),
    [
        ("", True),
        ("metadata.name=web-0", True),
        ("metadata.name==web-0", True),
        ("metadata.name!=web-0", False),
        ("spec.nodeName=n1,status.phase=Running", True),
        ("spec.nodeName=n1,status.phase!=Running", False),
        ("spec.nodeName=", False),
        ("spec.hostNetwork=true", True),
        ("metadata.namespace!=kube-system", True),
        ("spec.nodeName=n1,,", True),
    ],
)
def test_field_selector_matching(text: str, selected: bool) -> None:
    assert FieldSelector.parse(text, ALLOWED).matches(POD) is selected


def test_missing_fields_compare_as_the_empty_string() -> None:
    selector = FieldSelector.parse("spec.nodeName=", ALLOWED)
    assert selector.matches({"metadata": {"name": "x"}})
    assert selector.matches({"spec": "not-an-object"})
    assert field_value(POD, "spec.priority") == "7"
    assert field_value(POD, "spec") == ""


def test_unsupported_field_label_is_rejected_like_kube() -> None:
    with pytest.raises(ApiError) as caught:
        FieldSelector.parse("spec.foo=bar", ALLOWED)
    assert caught.value.code == 400
    assert caught.value.message == "field label not supported: spec.foo"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("metadata.name", "cannot understand 'metadata.name'"),
        ("metadata.name=a=b", "unescaped '='"),
        ("metadata.name=a\\x", "invalid escape sequence '\\\\x'"),
        ("metadata.name=a\\", "invalid escape sequence"),
    ],
)
def test_malformed_field_selector_is_a_bad_request(text: str, fragment: str) -> None:
    with pytest.raises(ApiError) as caught:
        FieldSelector.parse(text, ALLOWED)
    assert caught.value.code == 400
    assert fragment in caught.value.message


def test_field_values_unescape_backslash_sequences() -> None:
    selector = FieldSelector.parse(r"metadata.name=a\,b\=c\\d\!e", ALLOWED)
    assert selector.requirements == ((("metadata.name", FieldOp.EQUALS, "a,b=c\\d!e"),))
    assert str(selector) == r"metadata.name=a\,b\=c\\d!e"


def test_requirements_unpack_and_exact_value_pins_only_equality() -> None:
    selector = FieldSelector.parse("metadata.name!=x,spec.nodeName==n1", ALLOWED)
    [(path, op, value), second] = selector.requirements
    assert (path, op, value) == ("metadata.name", "!=", "x")
    assert second.op is FieldOp.EQUALS
    assert selector.exact_value("spec.nodeName") == "n1"
    assert selector.exact_value("metadata.name") is None
    assert selector.exact_value("status.phase") is None
    assert not selector.selects_everything
    assert FieldSelector.parse("", ALLOWED).selects_everything


# ---------------------------------------------------------------------------------------------- properties

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_name = st.builds(
    lambda first, middle, last: first + middle + last if middle or last else first,
    st.sampled_from(_ALNUM),
    st.text(_ALNUM + "-_.", max_size=8),
    st.sampled_from(["", *_ALNUM]),
).filter(lambda s: s[-1] in _ALNUM)
_dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)
_prefix = st.lists(_dns_label, min_size=1, max_size=3).map(".".join)
_key = st.one_of(_name, st.builds(lambda p, n: f"{p}/{n}", _prefix, _name), st.sampled_from(["in", "notin"]))
_value = st.one_of(st.just(""), _name)


@st.composite
def _requirements(draw: st.DrawFn) -> Requirement:
    key = draw(_key)
    op = draw(st.sampled_from(list(LabelOp)))
    if op in (LabelOp.EXISTS, LabelOp.DOES_NOT_EXIST):
        values: list[str] = []
    elif op in (LabelOp.GREATER_THAN, LabelOp.LESS_THAN):
        values = [str(draw(st.integers(0, 10**6)))]
    elif op in (LabelOp.IN, LabelOp.NOT_IN):
        values = draw(st.lists(_value, min_size=1, max_size=4))
    else:
        values = [draw(_value)]
    return label_requirement(key, op, values)


@given(st.text(max_size=60))
def test_label_selector_parse_raises_only_api_errors(text: str) -> None:
    try:
        parse_label_selector(text)
    except ApiError as exc:
        assert exc.code == 400


@given(st.text(alphabet="ab=!,() inotx\\/.-_<>", max_size=40))
def test_label_selector_parse_of_selector_shaped_text_raises_only_api_errors(text: str) -> None:
    try:
        selector = parse_label_selector(text)
    except ApiError as exc:
        assert exc.code == 400
    else:
        assert parse_label_selector(str(selector)) == selector


@given(
    st.lists(_requirements(), max_size=5),
    st.lists(st.dictionaries(_key, st.one_of(_value, st.integers(0, 10**6).map(str)), max_size=5), max_size=5),
)
def test_rendered_label_selector_parses_back_to_the_same_selector(
    requirements: list[Requirement], label_sets: list[dict[str, str]]
) -> None:
    selector = LabelSelector(tuple(requirements))
    again = parse_label_selector(str(selector))
    assert again == selector
    for labels in label_sets:
        assert again.matches(labels) == selector.matches(labels)


@given(st.text(max_size=60))
def test_field_selector_parse_raises_only_api_errors(text: str) -> None:
    try:
        FieldSelector.parse(text, ALLOWED)
    except ApiError as exc:
        assert exc.code == 400


_field_terms = st.tuples(st.sampled_from(sorted(ALLOWED)), st.sampled_from(list(FieldOp)), st.text(max_size=12))


@given(st.lists(_field_terms.map(lambda t: FieldRequirement(*t)), max_size=4), st.sampled_from(["", "x", "a,b=c"]))
def test_rendered_field_selector_parses_back_to_the_same_selector(
    requirements: list[FieldRequirement], name: str
) -> None:
    selector = FieldSelector(tuple(requirements))
    again = FieldSelector.parse(str(selector), ALLOWED)
    assert again == selector
    obj = {"metadata": {"name": name}}
    assert again.matches(obj) == selector.matches(obj)
