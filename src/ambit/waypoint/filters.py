"""What a route's filters do to a request: header changes, path and host rewrites, redirect locations.

Pure functions over :class:`~ambit.waypoint.decisions.RequestHead` values; :mod:`ambit.waypoint.routing` decides
which of them run and in which order.

Rules:

1. A header modifier removes first, then sets, then adds (Envoy's order, so ``remove: [x]`` with ``add: [x: 1]``
   leaves ``x: 1``). Names compare case-insensitively and are written lower-case. ``set`` replaces every value of
   the name with one value, at the position of the first one (appended when absent); ``add`` appends a value.
   ``host`` is the request's authority, not a header: setting it changes ``authority``, removing it is ignored.
2. An entry whose name is not an HTTP token, whose value holds CR, LF or NUL, or whose name is one of the
   message's framing and hop-by-hop headers (``content-length``, ``transfer-encoding``, ``connection``, ...: the
   shell writes those) is dropped: route authors must not be able to split or desynchronise a message
   (:func:`clean_modifier`, run once per table; :class:`HeaderEdit` is the request side's modifier made ready).
   Two modifiers applied one after the other are one modifier (:func:`chained`): the second's ``remove`` and
   ``set`` names drop the first's ``set`` and ``add`` entries of those names, and the lists are joined.
3. A path modifier changes the path and keeps the query. ``ReplaceFullPath`` replaces the path. ``ReplacePrefixMatch``
   replaces the matched prefix element-wise, trailing slashes of prefix and replacement ignored (Gateway API's
   table: prefix ``/foo``, replacement ``/xyz``: ``/foo/bar`` → ``/xyz/bar``, ``/foo`` → ``/xyz``; replacement
   ``/`` or empty: ``/foo/bar`` → ``/bar``, ``/foo`` → ``/``). With no prefix match (an Exact or RegularExpression
   match, which Gateway API forbids with ReplacePrefixMatch) the path is left as it is. After a VirtualService's
   plain string prefix match the matched characters are replaced as they are (Envoy's ``prefix_rewrite``: prefix
   ``/foo/``, replacement ``/ec``: ``/foo/ho`` → ``/echo``).
4. A redirect's ``Location`` is ``scheme://host[:port]path``: unset parts come from the request (host without its
   port). The port is the redirect's own; else, when the redirect sets a scheme, that scheme's well-known port
   (80 for http, 443 for https); else the listener port (the destination's Service port). Port 80 with http and 443
   with https are left out. A location with anything but visible ASCII is not sent (:func:`is_visible_ascii`; the
   router answers 500 instead). A VirtualService's redirect
   (:attr:`~ambit.model.routes.RequestRedirect.keeps_host_port`) follows Envoy instead: the host is the request's
   ``Host`` as sent, with its port, unless the redirect gives a port (then that one; the final scheme's default
   port is left out, as istiod leaves it out) or switches away from a scheme whose default port the ``Host``
   names (then none).
5. :func:`normalize_path` is Istio's default path normalization (``BASE``: Envoy's ``normalize_path``) in its
   RFC 3986 part: dot segments are removed (§5.2.4), ``%2e`` counting as a dot, never climbing above the root;
   slashes are not merged and escaped slashes are left alone. The shell applies it to every request before
   authorization and routing, so both see the path the backend will resolve.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ambit.model.field_names import is_token
from ambit.model.header_rules import has_line_break, is_framing
from ambit.model.routes import HeaderModifier, PathModifier, PathModifierType, RequestRedirect
from ambit.waypoint.decisions import RequestHead

__all__ = [
    "HeaderEdit",
    "apply_header_modifier",
    "clean_modifier",
    "is_visible_ascii",
    "normalize_path",
    "redirect_location",
    "replace_prefix",
    "rewrite_path",
    "split_authority",
    "split_target",
]

_VISIBLE = re.compile(r"[\x21-\x7e]+")
_WELL_KNOWN_PORTS = {"http": 80, "https": 443}


def _allowed(name: str) -> bool:
    return is_token(name) and not is_framing(name)


def is_visible_ascii(text: str) -> bool:
    """Whether ``text`` is one or more visible ASCII characters (no space, no control, nothing else)."""
    return _VISIBLE.fullmatch(text) is not None


def clean_modifier(modifier: HeaderModifier | None) -> HeaderModifier | None:
    """``modifier`` with names lower-cased and unsafe entries dropped (rule 2); None when nothing is left."""
    if modifier is None:
        return None
    set_ = tuple((n.lower(), v) for n, v in modifier.set if _allowed(n) and not has_line_break(v))
    add = tuple((n.lower(), v) for n, v in modifier.add if _allowed(n) and not has_line_break(v))
    remove = tuple(n.lower() for n in modifier.remove if _allowed(n))
    if not (set_ or add or remove):
        return None
    return HeaderModifier(set=set_, add=add, remove=remove)


def chained(first: HeaderModifier | None, then: HeaderModifier | None) -> HeaderModifier | None:
    """One modifier that does ``first`` and then ``then`` (rule 2; names already lower-case, as
    :func:`clean_modifier` leaves them): the same headers come out, up to the order of different names."""
    if first is None or then is None:
        return then if first is None else first
    dropped = set(then.remove) | {name for name, _ in then.set}
    return HeaderModifier(
        set=tuple(item for item in first.set if item[0] not in dropped) + then.set,
        add=tuple(item for item in first.add if item[0] not in dropped) + then.add,
        remove=tuple(dict.fromkeys(first.remove + then.remove)),
    )


@dataclass(frozen=True, slots=True, eq=False)
class HeaderEdit:
    """A request header modifier made ready to apply, once per table (rules 1 and 2)."""

    drop: frozenset[str]
    replace: dict[str, str]
    """``set`` entries but ``host``; a later entry for one name wins."""
    append: tuple[tuple[str, str], ...]
    """``add`` entries but ``host``."""
    authority: str | None
    """The last ``host`` value set or added, if any."""

    @classmethod
    def of(cls, modifier: HeaderModifier | None) -> HeaderEdit | None:
        cleaned = clean_modifier(modifier)
        if cleaned is None:
            return None
        hosts = [v for n, v in (*cleaned.set, *cleaned.add) if n == "host"]
        return cls(
            drop=frozenset(n for n in cleaned.remove if n != "host"),
            replace={n: v for n, v in cleaned.set if n != "host"},
            append=tuple((n, v) for n, v in cleaned.add if n != "host"),
            authority=hosts[-1] if hosts else None,
        )

    def apply(self, request: RequestHead) -> RequestHead:
        headers: list[tuple[str, str]] = []
        placed: set[str] = set()
        replace, drop = self.replace, self.drop
        for name, value in request.headers:
            if name in drop:
                continue
            new = replace.get(name)
            if new is None:
                headers.append((name, value))
            elif name not in placed:
                placed.add(name)
                headers.append((name, new))
        if len(placed) < len(replace):
            headers.extend((n, v) for n, v in replace.items() if n not in placed)
        headers.extend(self.append)
        authority = request.authority if self.authority is None else self.authority
        return RequestHead(request.method, request.path, authority, tuple(headers), request.scheme)


def apply_header_modifier(request: RequestHead, modifier: HeaderModifier) -> RequestHead:
    """``request`` with ``modifier`` applied (rules 1 and 2)."""
    edit = HeaderEdit.of(modifier)
    return request if edit is None else edit.apply(request)


_DOT = frozenset({".", "%2e", "%2E"})
_DOT_DOT = frozenset(a + b for a in _DOT for b in _DOT)


def normalize_path(target: str) -> str:
    """``target`` with the dot segments of its path removed (rule 5); the query is kept as it is."""
    path, query = split_target(target)
    if not path.startswith("/") or ("." not in path and "%" not in path):
        return target
    segments = path[1:].split("/")
    kept: list[str] = []
    for segment in segments:
        if segment in _DOT:
            continue
        if segment in _DOT_DOT:
            if kept:
                kept.pop()
            continue
        kept.append(segment)
    trailing = segments[-1] in _DOT or segments[-1] in _DOT_DOT
    normalized = "/" + "/".join(kept) + ("/" if trailing and kept else "")
    return normalized + query


def _envoy_location(
    request: RequestHead, redirect: RequestRedirect, matched_prefix: str | None, *, literal: bool
) -> str:
    """Rule 4's Envoy form (a VirtualService's redirect)."""
    scheme = redirect.scheme or request.scheme
    port = redirect.port
    if port is not None and _WELL_KNOWN_PORTS.get(scheme) == port:
        port = None  # istiod leaves out port 80 with http and 443 with https
    host = redirect.hostname or request.authority
    if not redirect.hostname:
        _, sent_port = split_authority(host)
        leaving = (
            scheme != request.scheme and sent_port is not None and _WELL_KNOWN_PORTS.get(request.scheme) == sent_port
        )
        if port is not None or leaving:
            host = split_authority(host)[0]
    if port is not None:
        host = f"{split_authority(host)[0]}:{port}"
    target = (
        request.path
        if redirect.path is None
        else rewrite_path(request.path, redirect.path, matched_prefix, literal=literal)
    )
    if not target.startswith("/"):
        target = "/" + target
    return f"{scheme}://{host}{target}"


def split_target(target: str) -> tuple[str, str]:
    """A request target's path and its query (with the ``?``; empty when there is none)."""
    path, mark, query = target.partition("?")
    return path, mark + query


def split_authority(authority: str) -> tuple[str, int | None]:
    """An authority's host and port (None when absent or not a number); IPv6 literals keep their brackets."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return authority, None
        host, rest = authority[: end + 1], authority[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, colon, port_text = authority.rpartition(":")
        if not colon:
            return authority, None
    if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5:
        return host, int(port_text)
    return (host if authority.startswith("[") else authority), None


def replace_prefix(path: str, prefix: str, replacement: str) -> str:
    """``path`` (which matched ``prefix`` element-wise) with that prefix replaced (rule 3)."""
    rest = path[len(prefix.rstrip("/")) :]
    return (replacement.rstrip("/") + rest) or "/"


def rewrite_path(target: str, modifier: PathModifier, matched_prefix: str | None, *, literal: bool = False) -> str:
    """The request target ``target`` after ``modifier`` (rule 3); the query is kept. ``literal``: the prefix
    matched as a plain string."""
    path, query = split_target(target)
    if modifier.kind is PathModifierType.REPLACE_FULL_PATH:
        return (modifier.value or "/") + query
    if matched_prefix is None:
        return target
    if literal:
        return ((modifier.value + path[len(matched_prefix) :]) or "/") + query
    return replace_prefix(path, matched_prefix, modifier.value) + query


def redirect_location(
    request: RequestHead,
    redirect: RequestRedirect,
    listener_port: int,
    matched_prefix: str | None,
    *,
    literal: bool = False,
) -> str:
    """The ``Location`` of ``redirect`` answering ``request`` (rule 4); ``literal`` as for :func:`rewrite_path`."""
    if redirect.keeps_host_port:
        return _envoy_location(request, redirect, matched_prefix, literal=literal)
    scheme = redirect.scheme or request.scheme
    host = redirect.hostname or split_authority(request.authority)[0]
    if redirect.port is not None:
        port = redirect.port
    elif redirect.scheme is not None and redirect.scheme in _WELL_KNOWN_PORTS:
        port = _WELL_KNOWN_PORTS[redirect.scheme]
    else:
        port = listener_port
    target = (
        request.path
        if redirect.path is None
        else rewrite_path(request.path, redirect.path, matched_prefix, literal=literal)
    )
    if not target.startswith("/"):
        target = "/" + target
    if _WELL_KNOWN_PORTS.get(scheme) == port:
        return f"{scheme}://{host}{target}"
    return f"{scheme}://{host}:{port}{target}"
