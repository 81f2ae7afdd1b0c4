"""Request input of the HTTP shell (:mod:`ambit.apiserver.http`): bodies and integer query parameters.

A body is at most :data:`MAX_BODY` bytes (aiohttp refuses more; the shell answers 413). It is read as protobuf
(``application/vnd.kubernetes.protobuf``, :mod:`ambit.apiserver.protobuf`), YAML (any content type naming yaml;
aliases are refused, :mod:`ambit.model.untrusted_yaml`) or JSON (``application/json``, ``*/*``, ``+json`` types and
no content type); any other content type is 415. An empty body, a body that does not parse, a body nested deeper
than :func:`~ambit.apiserver.nesting.check_depth` allows and a client that goes away mid-body are each a 400 with one
line saying why, never a traceback. An integer query parameter is absent (0), or a non-negative integer, else 400.
"""

from __future__ import annotations

from typing import Any

import yaml
from aiohttp import web

from ambit.apiserver import errors, protobuf
from ambit.apiserver.http_responses import JSON
from ambit.apiserver.nesting import check_depth
from ambit.apiserver.store import decode
from ambit.model import untrusted_yaml

MAX_BODY = 3 * 1024 * 1024


def int_param(q: Any, name: str) -> int:
    text = q.get(name)
    if text in (None, ""):
        return 0
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f"{name} must be an integer, not {text!r}") from None
    if value < 0:
        raise errors.bad_request(f"{name} must not be negative")
    return value


async def read_body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except ConnectionResetError:  # the client went away mid-body: nothing to store, nobody to answer
        raise errors.bad_request("the connection was lost while the request body was being read") from None
    return decode_body(raw, request.headers.get("Content-Type", ""))


def decode_body(raw: bytes, content_type: str) -> Any:
    doc = _decode_any(raw, content_type)
    check_depth(doc, "the request body")
    return doc


def _decode_any(raw: bytes, content_type: str) -> Any:
    if not raw.strip():
        raise errors.bad_request("the request body is empty")
    kind = content_type.split(";", maxsplit=1)[0].strip().lower()
    if kind == protobuf.CONTENT_TYPE:
        return protobuf.decode_protobuf_body(raw)
    if "yaml" in kind:
        try:
            return untrusted_yaml.load(raw)
        except untrusted_yaml.YamlAliasError as exc:
            mark = exc.problem_mark
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise errors.bad_request(f"{untrusted_yaml.ALIAS_PROBLEM}{where}") from None
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"the request body is not valid YAML: {exc}") from None
    if kind and kind not in (JSON, "*/*") and not kind.endswith("+json"):
        raise errors.unsupported_media_type(content_type)
    try:
        return decode(raw)
    except Exception as exc:
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None
