"""YAML from untrusted input (request bodies, files a user hands us): safe loading with no anchors or aliases.

Why: an alias is a reference, and a few hundred bytes of nested aliases ("billion laughs") describe a document of
billions of nodes. PyYAML shares the aliased objects, so loading is cheap, but everything that walks or encodes the
result (validation, JSON encoding, copies) expands it. Kubernetes manifests do not need aliases, so a document that
uses one is refused before anything is constructed.

Rules:

1. The document is parsed into events first (libyaml when available); the first alias event refuses the whole
   input with :class:`YamlAliasError`, which names its line and column. Anchors without aliases are harmless and
   accepted.
2. Only then is the input loaded, with the caller's safe loader (plain data: no Python objects).
"""

from __future__ import annotations

from typing import Any

import yaml

try:
    from yaml import CSafeLoader as SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader  # type: ignore[assignment]

__all__ = ["SafeLoader", "YamlAliasError", "load", "load_all"]

ALIAS_PROBLEM = "YAML aliases are not allowed"


class YamlAliasError(yaml.MarkedYAMLError):
    """The input uses an alias (``*name``), which untrusted YAML may not."""


def refuse_aliases(text: str | bytes, loader: type[Any] = SafeLoader) -> None:
    """Raise :class:`YamlAliasError` at the first alias in ``text`` (any YAML error of the parser passes through)."""
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise YamlAliasError(problem=ALIAS_PROBLEM, problem_mark=event.start_mark)  # type: ignore[arg-type]


def load(text: str | bytes, loader: type[Any] = SafeLoader) -> Any:
    """The single document in ``text``; aliases refused (rule 1)."""
    refuse_aliases(text, loader)
    return yaml.load(text, Loader=loader)  # callers pass SafeLoader or a subclass of it


def load_all(text: str | bytes, loader: type[Any] = SafeLoader) -> list[Any]:
    """Every document in ``text``; aliases refused (rule 1)."""
    refuse_aliases(text, loader)
    return list(yaml.load_all(text, Loader=loader))
