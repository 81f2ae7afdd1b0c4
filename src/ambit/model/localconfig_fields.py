"""Reading a local config file's values: each reader takes the value and its path, and raises
:class:`~ambit.model.errors.LocalConfigError` naming that path.

Theory of operation: :mod:`ambit.model.localconfig` walks the loaded YAML document with a path in hand and hands
each value to one of these readers, so every complaint names the field that caused it (``workloads[2].
workloadIps[0]: not an IP address: 'x'``). They carry the file's general rules (:mod:`ambit.model.localconfig`
rules 1-3): a mapping's keys are checked against the keys it may have, a missing or null key takes its default or is
required, strings are printable, and names that end up in a SPIFFE id use its charset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ambit.model.errors import IdentityError, LocalConfigError
from ambit.model.identity import check_path_segment, check_trust_domain

__all__ = [
    "choice",
    "describe",
    "read_bool",
    "read_each",
    "read_field",
    "read_list",
    "read_mapping",
    "read_name",
    "read_namespace",
    "read_optional_string",
    "read_port",
    "read_service_account",
    "read_string",
    "read_trust_domain",
]

T = TypeVar("T")


def describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def read_mapping(value: object, path: str, allowed: tuple[str, ...] | None = None) -> Mapping[Any, Any]:
    if not isinstance(value, dict):
        raise LocalConfigError(f"{path}: expected a mapping, got {describe(value)}")
    if allowed is not None:
        unknown = [key for key in value if key not in allowed]
        if unknown:
            names = ", ".join(repr(key) for key in unknown)
            raise LocalConfigError(f"{path}: unknown key(s) {names}; known keys: {', '.join(allowed)}")
    return value


def read_list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise LocalConfigError(f"{path}: expected a list, got {describe(value)}")
    return value


def read_string(value: object, path: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise LocalConfigError(f"{path}: expected a string, got {describe(value)}")
    if non_empty and not value:
        raise LocalConfigError(f"{path}: must not be empty")
    if not value.isprintable():
        raise LocalConfigError(f"{path}: has unprintable characters: {value!r}")
    return value


def read_field(
    item: Mapping[Any, Any], key: str, path: str, read: Callable[[object, str], T], default: T | None = None
) -> T:
    """``read`` the value at ``key``; a missing or null key gives ``default``, or is an error when it is None."""
    value = item.get(key)
    if value is None:
        if default is None:
            raise LocalConfigError(f"{path}.{key}: required")
        return default
    return read(value, f"{path}.{key}")


def read_name(value: object, path: str) -> str:
    return read_string(value, path, non_empty=True)


def read_optional_string(value: object, path: str) -> str:
    return read_string(value, path)


def _identity_part(check: Callable[[str], None], *, non_empty: bool) -> Callable[[object, str], str]:
    def read(value: object, path: str) -> str:
        text = read_string(value, path, non_empty=non_empty)
        if text:
            try:
                check(text)
            except IdentityError as exc:
                raise LocalConfigError(f"{path}: {exc}") from None
        return text

    return read


read_namespace = _identity_part(lambda text: check_path_segment("namespace", text), non_empty=True)
read_service_account = _identity_part(lambda text: check_path_segment("service account", text), non_empty=False)
read_trust_domain = _identity_part(check_trust_domain, non_empty=False)


def choice(choices: Mapping[str, T]) -> Callable[[object, str], T]:
    def read(value: object, path: str) -> T:
        if isinstance(value, str) and value in choices:
            return choices[value]
        raise LocalConfigError(f"{path}: expected one of {', '.join(choices)}, got {describe(value)}")

    return read


def read_port(value: object, path: str, *, lowest: int) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # JSON-style maps have string keys
    if not isinstance(value, int) or isinstance(value, bool) or not lowest <= value <= 65535:
        raise LocalConfigError(f"{path}: expected a port number {lowest}..65535, got {describe(value)}")
    return value


def read_bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise LocalConfigError(f"{path}: expected true or false, got {describe(value)}")
    return value


def read_each(item: Mapping[Any, Any], key: str, path: str, read: Callable[[object, str], T]) -> tuple[T, ...]:
    return tuple(read(v, f"{path}.{key}[{i}]") for i, v in enumerate(read_list(item.get(key), f"{path}.{key}")))
