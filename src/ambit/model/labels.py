"""Label selectors: whether a selector selects a set of labels. The one definition; everything else imports it.

Theory of operation:

- A :class:`LabelSelector` is a conjunction of :class:`Requirement` s, one label each; no requirements selects
  everything. The operators are Kubernetes' (``selection.Operator``): ``in``, ``notin``, ``=``, ``!=``,
  ``exists``, ``!`` (does not exist), ``>`` and ``<``.
- ``!=`` and ``notin`` select objects that lack the label; ``in`` and ``=`` need it. ``>`` and ``<`` need the
  label, and both it and the requirement's value must be integers.
- Objects carry selectors in two shapes. A ``metav1.LabelSelector`` is ``matchLabels`` (each pair an ``=``
  requirement) plus ``matchExpressions`` with ``In``, ``NotIn``, ``Exists`` and ``DoesNotExist``; an empty one
  selects everything. A plain map (a Service's ``spec.selector``, a pod's ``nodeSelector``) is ``matchLabels``
  alone.
- :func:`selector_from_spec` reads the object shape without judging keys and values, and gives None for a
  malformed shape; :func:`selector_matches` treats a malformed selector as selecting nothing, so a bad object
  never grabs pods. :func:`label_key_problem` and :func:`label_value_problem` say why a key or value breaks
  Kubernetes' grammar; the API server (the text form ``a=b,c in (x)``) and the mesh config's selectors use them.
- ``str()`` renders the selector-string form, which the API server's parser reads back to an equal selector.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
"""What ``>`` and ``<`` accept on either side (Kubernetes parses both as 64-bit integers)."""


_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE = (
    "must be 63 characters or less, consist of alphanumeric characters, '-', '_' or '.', "
    "and start and end with an alphanumeric character"
)


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (a qualified name with an optional DNS prefix), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix or "/" in prefix:
            return "a label key is an optional DNS subdomain prefix and '/' followed by a name"
        if len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
            return "the prefix must be a lowercase DNS subdomain of at most 253 characters"
    if not name:
        return "the name part must not be empty"
    if len(name) > 63 or not _NAME_RE.fullmatch(name):
        return f"the name part {_NAME_RULE}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value (empty, or a name of at most 63 characters), or None."""
    if value == "" or (len(value) <= 63 and _NAME_RE.fullmatch(value)):
        return None
    return f"a label value {_NAME_RULE}"


class Operator(enum.StrEnum):
    IN = "in"
    NOT_IN = "notin"
    EQUALS = "="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = ">"
    LESS_THAN = "<"


SPEC_OPERATORS: Mapping[str, Operator] = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}
"""The ``matchExpressions`` operators of a ``metav1.LabelSelector``."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One condition on one label."""

    key: str
    op: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        match self.op:
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.IN | Operator.EQUALS:
                return present and labels[self.key] in self.values
            case Operator.NOT_IN | Operator.NOT_EQUALS:
                return not present or labels[self.key] not in self.values
        if not present or not INTEGER.fullmatch(labels[self.key]):
            return False
        have, want = int(labels[self.key]), int(self.values[0])
        return have > want if self.op is Operator.GREATER_THAN else have < want

    def __str__(self) -> str:
        match self.op:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.IN | Operator.NOT_IN:
                return f"{self.key} {self.op} ({','.join(self.values)})"
        return f"{self.key}{self.op}{self.values[0]}"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of label requirements; no requirements selects everything."""

    requirements: tuple[Requirement, ...] = ()

    @property
    def selects_everything(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(req.matches(labels) for req in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(req) for req in self.requirements)


def selector_from_map(selector: Mapping[str, str]) -> LabelSelector:
    """A plain map selector (or ``matchLabels``): every pair must be present and equal."""
    return LabelSelector(tuple(Requirement(k, Operator.EQUALS, (v,)) for k, v in selector.items()))


def selector_from_spec(spec: Any) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` object as a selector, or None when its shape is malformed."""
    if not isinstance(spec, Mapping):
        return None
    match_labels = spec.get("matchLabels") or {}
    expressions = spec.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return None
    requirements = list(selector_from_map(match_labels).requirements)
    for expr in expressions:
        if not isinstance(expr, Mapping):
            return None
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        op = SPEC_OPERATORS.get(operator) if isinstance(operator, str) else None
        if not isinstance(key, str) or not isinstance(values, list) or op is None:
            return None
        requirements.append(Requirement(key, op, tuple(values)))
    return LabelSelector(tuple(requirements))


def selector_matches(spec: Any, labels: Mapping[str, str]) -> bool:
    """Whether a ``metav1.LabelSelector`` object selects ``labels``; a malformed one selects nothing."""
    selector = selector_from_spec(spec)
    return selector is not None and selector.matches(labels)


def map_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a plain map selector selects ``labels``: every pair present and equal."""
    return selector_from_map(selector).matches(labels)
