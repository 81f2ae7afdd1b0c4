"""How deeply a request body or an object may nest: at most ``MAX_DEPTH`` levels of mappings and lists.

Why: the server's own code walks objects recursively (``copy.deepcopy`` before every patch and deletion, merge and
strategic patches, encoders), and Python's recursion limit (1,000 frames, a few per level) is far below the depth
the decoders accept (libyaml nests up to 1,000 levels, msgspec until the interpreter's limit). Without a bound, a
body a few hundred levels deep was stored and then could be neither patched nor deleted (500 on every write of it),
and a YAML body between the two limits was a 500. Kube-apiserver's decoders stop at 10,000 levels; Go's stack has
room for that, ours has not, so ours stop at ``MAX_DEPTH``, far above any object Kubernetes or Istio defines (the
deepest manifest under ``deploy/``, a CRD's schema, nests 21 levels) and far below the recursion limit.

Invariants: :func:`check_depth` never recurses (it walks level by level, so a document of any depth is judged
in time linear in its size) and stops at the first level beyond the bound. The bound is checked on every decoded
body and patch, on the result of every patch, and on every object the store writes, so no stored object exceeds it;
:func:`copy_document`, which recurses, is for such documents only.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from ambit.apiserver import errors

MAX_DEPTH = 200
"""Levels of nesting allowed, the outermost mapping counting as 1 (``{"a": {"b": 1}}`` nests 2 levels)."""


def depth_exceeds(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``doc`` (decoded JSON: dicts, lists, scalars) nests more than ``limit`` levels.

    Walked one level at a time (the mappings and lists of each level gathered into one list), so no recursion and
    no per-node bookkeeping of levels."""
    level: list[Any] = [doc] if isinstance(doc, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for node in level:
            for child in node.values() if isinstance(node, dict) else node:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below
    return False


Doc = TypeVar("Doc")


def copy_document(doc: Doc) -> Doc:
    """A copy of ``doc`` (decoded JSON or YAML) whose mappings and lists are new and whose scalars are shared
    (they are immutable). It recurses, once per level: call it only on what :func:`check_depth` admitted (every
    request body, patched object and stored object is), whose depth is bounded by ``MAX_DEPTH``."""
    if isinstance(doc, dict):
        return cast(Doc, {k: copy_document(v) if isinstance(v, (dict, list)) else v for k, v in doc.items()})
    if isinstance(doc, list):
        return cast(Doc, [copy_document(v) if isinstance(v, (dict, list)) else v for v in doc])
    return doc


def check_depth(doc: Any, what: str) -> None:
    """400 Bad Request when ``doc`` nests more than ``MAX_DEPTH`` levels; ``what`` names it (``the request
    body``, ``the patch``, ``the patched object``)."""
    if depth_exceeds(doc):
        raise errors.bad_request(f"{what} is nested more than {MAX_DEPTH} levels deep")
