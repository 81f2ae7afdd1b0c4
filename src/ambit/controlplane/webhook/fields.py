"""Walking an untrusted JSON object and collecting what is wrong with it, field by field.

Theory of operation. A validator gets a plain JSON value (whatever the API server decoded) and must never raise
on it: every shape check goes through a :class:`Fields` accumulator whose readers (:meth:`Fields.mapping`,
:meth:`Fields.sequence`, :meth:`Fields.string`, ...) return either a value of the expected Python type or a
neutral stand-in (``{}``, ``[]``, ``None``) after recording a :class:`FieldError` at that field's path. The
validator then carries on with the stand-in, so one bad field never hides the others.

Paths are written as kubectl users read them: ``spec.rules[0].to[1].operation.ports[2]``, map entries as
``spec.portLevelMtls[8080]``.

Istio objects are protobuf messages decoded from JSON, which accepts each field under its lowerCamelCase JSON
name or its original snake_case name; :func:`get` and the ``known`` sets honour both. Gateway API objects are
plain Kubernetes JSON and pass ``proto=False`` so only the declared names count.

Invariants: readers never raise for any JSON input; an error's path always starts at the object's root.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.model.dnsname import is_ip


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one field; ``warning`` ones are reported but do not reject the object."""

    path: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])([A-Z])")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_]*[A-Za-z0-9])?")


def snake(name: str) -> str:
    """The protobuf field name behind a JSON name: ``notPrincipals`` → ``not_principals``."""
    return _CAMEL_HUMP.sub(lambda m: "_" + m.group(1).lower(), name)


def get(obj: Mapping[str, Any], name: str) -> Any:
    """A protobuf-JSON field by its JSON name, falling back to its snake_case name."""
    if name in obj:
        return obj[name]
    return obj.get(snake(name))


def is_dns_label(text: str) -> bool:
    """RFC 1123 label as Kubernetes names use it: lower case, at most 63 characters."""
    return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str) -> bool:
    return 0 < len(text) <= 253 and all(is_dns_label(part) for part in text.split("."))


def is_hostname(text: str, *, wildcard: bool = True) -> bool:
    """A DNS name (short or fully qualified), optionally with a leading ``*.`` or being ``*.`` free."""
    if wildcard and text.startswith("*."):
        text = text[2:]
    if not text or len(text) > 253 or text.endswith("."):
        return False
    return all(len(part) <= 63 and _HOST_LABEL.fullmatch(part) for part in text.split("."))


def is_ip_or_cidr(text: str) -> bool:
    """An address or a prefix as Go's ``netip`` parses them: the length is a plain decimal, host bits allowed."""
    address, slash, length = text.partition("/")
    if not slash:
        return is_ip(address)
    if not length.isdigit() or length != str(int(length)) or not is_ip(address):
        return False
    return int(length) <= (32 if ipaddress.ip_address(address).version == 4 else 128)


def port_number(value: Any) -> int | None:
    """``value`` as a port number if it is one (an integer, or a decimal string as protobuf JSON allows)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if isinstance(value, int) and 1 <= value <= 65535:
        return value
    return None


def describe(value: Any) -> str:
    """A JSON value named by its JSON type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class Fields:
    """The error list of one validation, and the readers that fill it."""

    __slots__ = ("errors", "proto")

    def __init__(self, *, proto: bool = True) -> None:
        self.errors: list[FieldError] = []
        self.proto = proto

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def warn(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message, warning=True))

    def get(self, obj: Mapping[str, Any], name: str) -> Any:
        return get(obj, name) if self.proto else obj.get(name)

    def mapping(
        self, value: Any, path: str, *, required: bool = False, known: Collection[str] | None = None
    ) -> dict[str, Any]:
        """An object; with ``known``, any other key is an error (Istio decodes specs strictly)."""
        if value is None:
            if required:
                self.error(path, "required field is missing")
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected an object, got {describe(value)}")
            return {}
        if known is not None:
            names = set(known) | ({snake(k) for k in known} if self.proto else set())
            for key in value:
                if key not in names:
                    self.error(f"{path}.{key}", "unknown field")
        return value

    def sequence(self, value: Any, path: str, *, required: bool = False, limit: int | None = None) -> list[Any]:
        """An array; ``required`` also refuses an empty one."""
        if value is None or value == []:
            if required:
                self.error(path, "required field is missing" if value is None else "must not be empty")
            return []
        if not isinstance(value, list):
            self.error(path, f"expected an array, got {describe(value)}")
            return []
        if limit is not None and len(value) > limit:
            self.error(path, f"must have at most {limit} items, has {len(value)}")
        return value

    def objects(
        self, value: Any, path: str, *, required: bool = False, limit: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """The object items of an array with their paths; non-object items are errors and are skipped."""
        items = []
        for i, item in enumerate(self.sequence(value, path, required=required, limit=limit)):
            if isinstance(item, dict):
                items.append((f"{path}[{i}]", item))
            else:
                self.error(f"{path}[{i}]", f"expected an object, got {describe(item)}")
        return items

    def string(self, value: Any, path: str, *, required: bool = False) -> str | None:
        """A string; ``required`` also refuses an empty one."""
        if value is None or value == "":
            if required:
                self.error(path, "required field is missing" if value is None else "must not be empty")
            return None
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {describe(value)}")
            return None
        return value

    def strings(self, value: Any, path: str, *, required: bool = False) -> list[tuple[str, str]]:
        """A list of non-empty strings with their paths; bad items are errors and are skipped."""
        items = []
        for i, item in enumerate(self.sequence(value, path, required=required)):
            text = self.string(item, f"{path}[{i}]", required=True)
            if text is not None:
                items.append((f"{path}[{i}]", text))
        return items

    def enum(self, value: Any, path: str, allowed: Collection[str], *, required: bool = False) -> str | None:
        text = self.string(value, path, required=required)
        if text is not None and text not in allowed:
            self.error(path, f"unsupported value {text!r}: expected one of {', '.join(allowed)}")
            return None
        return text

    def integer(
        self, value: Any, path: str, *, low: int, high: int, required: bool = False, what: str = "value"
    ) -> int | None:
        """An integer in ``low..high`` (protobuf JSON also allows it as a decimal string)."""
        if value is None:
            if required:
                self.error(path, "required field is missing")
            return None
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif self.proto and isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,20}", value):
            number = int(value)
        if number is None:
            self.error(path, f"expected an integer, got {describe(value)}")
            return None
        if not low <= number <= high:
            self.error(path, f"{what} {number} is out of range {low}-{high}")
            return None
        return number

    def port(self, value: Any, path: str, *, required: bool = False) -> int | None:
        return self.integer(value, path, low=1, high=65535, required=required, what="port number")

    def labels(self, value: Any, path: str) -> dict[str, str]:
        """A label map (selector ``matchLabels`` and the like): string keys and string values."""
        result: dict[str, str] = {}
        for key, item in self.mapping(value, path).items():
            if not key or len(key) > 317:
                self.error(f"{path}[{key}]", "invalid label key")
            elif not isinstance(item, str):
                self.error(f"{path}[{key}]", f"expected a string, got {describe(item)}")
            else:
                result[key] = item
        return result

    def selector(self, value: Any, path: str, labels_name: str = "matchLabels") -> dict[str, str] | None:
        """An Istio ``WorkloadSelector`` (``{matchLabels: {...}}``); None when absent."""
        if value is None:
            return None
        selector = self.mapping(value, path, known=(labels_name,))
        return self.labels(self.get(selector, labels_name), f"{path}.{labels_name}")
