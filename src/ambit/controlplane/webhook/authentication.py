"""Validation of ``security.istio.io`` PeerAuthentication (spec §7.4) and RequestAuthentication (shallow).

Theory of operation. Both specs are decoded strictly (unknown fields are errors).

PeerAuthentication: ``mtls.mode`` is UNSET, DISABLE, PERMISSIVE or STRICT; ``portLevelMtls`` maps port numbers
(1-65535, written as JSON object keys) to a ``{mode}`` and only makes sense for a workload, so it needs a
``selector`` with labels (istiod refuses it otherwise).

RequestAuthentication: ``selector``/``targetRefs`` as for every policy; each ``jwtRules[]`` names an ``issuer``;
``jwksUri`` is an http(s) URL with a host; headers to read the token from, and claims copied to headers, name
what they need. The JWKS document itself is not parsed here.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ambit.controlplane.webhook.attachment import check_attachment
from ambit.controlplane.webhook.fields import Fields, describe, port_number
from ambit.model.field_names import is_token

MTLS_MODES = ("UNSET", "DISABLE", "PERMISSIVE", "STRICT")
_JWT_RULE = (
    "issuer",
    "audiences",
    "jwksUri",
    "jwks",
    "fromHeaders",
    "fromParams",
    "fromCookies",
    "outputPayloadToHeader",
    "forwardOriginalToken",
    "outputClaimToHeaders",
    "timeout",
    "spaceDelimitedClaims",
)
_DURATION = re.compile(r"[0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h)")


def validate_peer_authentication(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(obj.get("spec"), "spec", known=("selector", "mtls", "portLevelMtls"))
    selector = f.selector(f.get(spec, "selector"), "spec.selector")
    mtls = f.mapping(f.get(spec, "mtls"), "spec.mtls", known=("mode",))
    f.enum(mtls.get("mode"), "spec.mtls.mode", MTLS_MODES)
    port_level = f.mapping(f.get(spec, "portLevelMtls"), "spec.portLevelMtls")
    if port_level and not selector:
        f.error("spec.portLevelMtls", "port-level mTLS needs a spec.selector with labels: it applies to workloads")
    for key, value in port_level.items():
        path = f"spec.portLevelMtls[{key}]"
        if port_number(key) is None or key != key.strip():
            f.error(path, f"key {key!r} is not a port number (1-65535)")
        if value is None:
            f.error(path, "must not be empty: expected {mode: ...}")
            continue
        entry = f.mapping(value, path, known=("mode",))
        f.enum(entry.get("mode"), f"{path}.mode", MTLS_MODES)
    return f


def validate_request_authentication(obj: dict[str, Any]) -> Fields:
    f = Fields()
    metadata = f.mapping(obj.get("metadata"), "metadata")
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    spec = f.mapping(obj.get("spec"), "spec", known=("selector", "targetRef", "targetRefs", "jwtRules"))
    check_attachment(f, spec, namespace)
    for path, rule in f.objects(f.get(spec, "jwtRules"), "spec.jwtRules"):
        _check_jwt_rule(f, rule, path)
    return f


def _check_jwt_rule(f: Fields, rule: dict[str, Any], path: str) -> None:
    f.mapping(rule, path, known=_JWT_RULE)
    f.string(rule.get("issuer"), f"{path}.issuer", required=True)
    f.strings(rule.get("audiences"), f"{path}.audiences")
    uri = f.string(f.get(rule, "jwksUri"), f"{path}.jwksUri")
    if uri is not None:
        try:
            parts = urlsplit(uri)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            ok = False
        if not ok:
            f.error(f"{path}.jwksUri", f"{uri!r} is not an http or https URL with a host")
    f.string(rule.get("jwks"), f"{path}.jwks")
    for header_path, header in f.objects(f.get(rule, "fromHeaders"), f"{path}.fromHeaders"):
        f.mapping(header, header_path, known=("name", "prefix"))
        _header_name(f, header.get("name"), f"{header_path}.name")
        f.string(header.get("prefix"), f"{header_path}.prefix")
    f.strings(f.get(rule, "fromParams"), f"{path}.fromParams")
    f.strings(f.get(rule, "fromCookies"), f"{path}.fromCookies")
    f.string(f.get(rule, "outputPayloadToHeader"), f"{path}.outputPayloadToHeader")
    for claim_path, claim in f.objects(f.get(rule, "outputClaimToHeaders"), f"{path}.outputClaimToHeaders"):
        f.mapping(claim, claim_path, known=("header", "claim"))
        _header_name(f, claim.get("header"), f"{claim_path}.header")
        f.string(claim.get("claim"), f"{claim_path}.claim", required=True)
    forward = f.get(rule, "forwardOriginalToken")
    if forward is not None and not isinstance(forward, bool):
        f.error(f"{path}.forwardOriginalToken", f"expected a boolean, got {describe(forward)}")
    timeout = f.string(rule.get("timeout"), f"{path}.timeout")
    if timeout is not None and not _DURATION.fullmatch(timeout):
        f.error(f"{path}.timeout", f"{timeout!r} is not a duration like 5s")
    f.strings(f.get(rule, "spaceDelimitedClaims"), f"{path}.spaceDelimitedClaims")


def _header_name(f: Fields, value: Any, path: str) -> None:
    name = f.string(value, path, required=True)
    if name is not None and not is_token(name):
        f.error(path, f"{name!r} is not a valid HTTP header name")
