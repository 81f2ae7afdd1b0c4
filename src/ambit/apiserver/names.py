"""Names and keys in object metadata: their grammars, and how a violation is worded for the user.

Theory of operation: each grammar function takes a string and returns the list of its problems (empty when the
string is fine), phrased as kube-apiserver phrases them, because users read them through kubectl. The field
error helpers (:func:`invalid`, :func:`required`, ...) turn a problem into a ``(field path, message)`` cause.

Which grammar applies where (kube-apiserver's choices):

- DNS-1123 subdomain (<= 253, ``[a-z0-9]`` runs joined by ``-`` and ``.``): most object names.
- DNS-1123 label (<= 63, no dots): namespaces, container, port and volume names.
- DNS-1035 label (a label that starts with a letter): Service names, because they become DNS names.
- Qualified name (``[subdomain/]name``, name <= 63, mixed case): label and annotation keys, finalizers.
- Label value (<= 63, may be empty).

Invariant: nothing here raises for any input of the documented types; the validators that accept ``Any``
report a wrong type as a cause.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

Cause = tuple[str, str]
"""(field path, message), as ``errors.invalid`` takes them."""

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
GENERATED_NAME_MAX = 63
"""Names made from generateName fit in a DNS label whatever the kind (kube's SimpleNameGenerator)."""
ANNOTATIONS_MAX_BYTES = 256 * 1024

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


# ---- wording of field errors -----------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A value as a field error quotes it: strings in double quotes, other JSON compactly, cut if long."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def invalid(path: str, value: Any, detail: str) -> Cause:
    return (path, f"Invalid value: {shown(value)}: {detail}")


def required(path: str, detail: str = "") -> Cause:
    return (path, f"Required value: {detail}" if detail else "Required value")


def duplicate(path: str, value: Any) -> Cause:
    return (path, f"Duplicate value: {shown(value)}")


def unsupported(path: str, value: Any, supported: tuple[str, ...]) -> Cause:
    choices = ", ".join(json.dumps(s) for s in supported)
    return (path, f"Unsupported value: {shown(value)}: supported values: {choices}")


def too_long(path: str, limit: int) -> Cause:
    return (path, f"Too long: must have at most {limit} bytes")


def forbidden(path: str, detail: str) -> Cause:
    return (path, f"Forbidden: {detail}")


# ---- grammars --------------------------------------------------------------------------------------------


def _too_long(value: str, limit: int) -> list[str]:
    return [f"must be no more than {limit} characters"] if len(value) > limit else []


def dns1123_label(value: str) -> list[str]:
    """Problems with ``value`` as an RFC 1123 label; empty when fine."""
    found = _too_long(value, DNS1123_LABEL_MAX)
    if not _DNS1123_LABEL.fullmatch(value):
        found.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
            "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
            f"validation is '{_LABEL}')"
        )
    return found


def dns1123_subdomain(value: str) -> list[str]:
    """Problems with ``value`` as an RFC 1123 subdomain; empty when fine."""
    found = _too_long(value, DNS1123_SUBDOMAIN_MAX)
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        found.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            f"validation is '{_DNS1123_SUBDOMAIN.pattern}')"
        )
    return found


def dns1035_label(value: str) -> list[str]:
    """Problems with ``value`` as an RFC 1035 label: an RFC 1123 label that starts with a letter."""
    found = _too_long(value, DNS1123_LABEL_MAX)
    if not _DNS1035_LABEL.fullmatch(value):
        found.append(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
            f"regex used for validation is '{_DNS1035_LABEL.pattern}')"
        )
    return found


def path_segment(value: str) -> list[str]:
    """Problems with ``value`` as a URL path segment (RBAC names such as ``system:controller:x``)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in "/%" if c in value]


def qualified_name(value: str) -> list[str]:
    """Problems with ``value`` as a label or annotation key: ``[prefix/]name``, the prefix a subdomain."""
    if value.count("/") > 1:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character, with an optional DNS subdomain prefix and '/' (e.g. "
            "'example.com/MyName')"
        ]
    prefix, slash, name = value.rpartition("/")
    found = []
    if slash and not prefix:
        found.append("prefix part must be non-empty")
    elif slash:
        found.extend(f"prefix part {msg}" for msg in dns1123_subdomain(prefix))
    if not name:
        found.append("name part must be non-empty")
        return found
    if len(name) > DNS1123_LABEL_MAX:
        found.append(f"name part must be no more than {DNS1123_LABEL_MAX} characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        found.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
            "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
            f"validation is '{_QUALIFIED_NAME.pattern}')"
        )
    return found


def label_value(value: str) -> list[str]:
    found = _too_long(value, DNS1123_LABEL_MAX)
    if not _LABEL_VALUE.fullmatch(value):
        found.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
            f"'12345', regex used for validation is '{_LABEL_VALUE.pattern}')"
        )
    return found


def generate_name(prefix: str, random_suffix: str) -> str:
    """The name for ``metadata.generateName: prefix``: the prefix cut so the whole fits in 63, then the suffix.

    kube-apiserver appends 5 random characters and so cuts the prefix to 58, for every kind alike, even those
    whose names may be 253 long.
    """
    keep = max(GENERATED_NAME_MAX - len(random_suffix), 0)
    return prefix[:keep] + random_suffix


# ---- label and annotation maps ---------------------------------------------------------------------------


def validate_labels(labels: Any, path: str) -> list[Cause]:
    """Causes for a ``labels``-shaped map (also selectors' ``matchLabels``); None means absent and is fine."""
    if labels is None:
        return []
    if not isinstance(labels, Mapping):
        return [invalid(path, labels, "must be a map of string keys to string values")]
    causes = []
    for key, value in labels.items():
        if not isinstance(key, str):
            causes.append(invalid(path, key, "keys must be strings"))
            continue
        causes.extend(invalid(path, key, msg) for msg in qualified_name(key))
        if not isinstance(value, str):
            causes.append(invalid(f"{path}[{key}]", value, "values must be strings"))
        else:
            causes.extend(invalid(f"{path}[{key}]", value, msg) for msg in label_value(value))
    return causes


def validate_annotations(annotations: Any, path: str) -> list[Cause]:
    """Causes for ``metadata.annotations``: qualified keys (any case), string values, 256 KiB in all."""
    if annotations is None:
        return []
    if not isinstance(annotations, Mapping):
        return [invalid(path, annotations, "must be a map of string keys to string values")]
    causes = []
    total = 0
    for key, value in annotations.items():
        if not isinstance(key, str):
            causes.append(invalid(path, key, "keys must be strings"))
            continue
        causes.extend(invalid(path, key, msg) for msg in qualified_name(key.lower()))
        if not isinstance(value, str):
            causes.append(invalid(f"{path}[{key}]", value, "values must be strings"))
            continue
        total += _utf8_len(key) + _utf8_len(value)
    if total > ANNOTATIONS_MAX_BYTES:
        causes.append(too_long(path, ANNOTATIONS_MAX_BYTES))
    return causes


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))
