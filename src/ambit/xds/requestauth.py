"""Model RequestAuthentications ↔ ``ambit.waypoint.v1.RequestAuthentication`` (``proto/requestauth.proto``),
carried in WaypointConfig field 4.

Theory of operation: :func:`request_authentication_to_proto` encodes field for field (the control plane's side);
:class:`RequestAuthReader` judges what a waypoint was sent, the first problem raising
:class:`~ambit.xds.errors.XdsConversionError` naming the resource and the field (e.g. ``app/waypoint:
request_authentications[0].rules[1].jwks_uri: 'file:///x' is not an http or https URL with a host``), so that the
client NACKs that resource and keeps its last good config.

Rules:

1. A policy has a name and a namespace (a DNS label); its service keys are printable and non-empty.
2. A rule has an issuer and exactly one of ``jwks`` and ``jwks_uri``; audiences are non-empty.
3. ``jwks_uri`` is an http or https URL with a host; ``jwks`` is a JSON object with a ``keys`` list, at most
   :data:`~ambit.model.requestauth.MAX_JWKS_BYTES` long (which of its keys are usable the waypoint judges when it
   builds its key sets, refusing tokens it cannot check).
4. Header names (token headers, the payload header, claim headers) are lower-case HTTP tokens; a prefix carries
   no CR, LF or NUL; parameter, cookie and claim names are non-empty and printable.
5. ``timeout`` is positive; absent it is 5 s.
6. Nothing but :class:`~ambit.xds.errors.XdsConversionError` escapes decoding.
"""

from __future__ import annotations

import json

from google.protobuf import duration_pb2

from ambit.api import requestauth_pb2 as pb
from ambit.model.field_names import LOWER_TOKEN
from ambit.model.requestauth import (
    MAX_JWKS_BYTES,
    ClaimToHeader,
    JwtHeader,
    JwtRule,
    RequestAuthentication,
    jwks_uri_problem,
)
from ambit.xds.convert import FieldReader

__all__ = ["RequestAuthReader", "request_authentication_to_proto"]

DEFAULT_TIMEOUT_SECONDS = 5.0


def _duration(seconds: float) -> duration_pb2.Duration:
    nanos = round(seconds * 1_000_000_000)
    return duration_pb2.Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def _rule_to_proto(rule: JwtRule) -> pb.JwtRule:
    return pb.JwtRule(
        issuer=rule.issuer,
        audiences=list(rule.audiences),
        jwks=rule.jwks,
        jwks_uri=rule.jwks_uri,
        from_headers=[pb.JwtHeader(name=h.name, prefix=h.prefix) for h in rule.from_headers],
        from_params=list(rule.from_params),
        from_cookies=list(rule.from_cookies),
        output_payload_to_header=rule.output_payload_to_header,
        output_claim_to_headers=[
            pb.ClaimToHeader(header=c.header, claim=c.claim) for c in rule.output_claim_to_headers
        ],
        forward_original_token=rule.forward_original_token,
        timeout=_duration(rule.timeout_seconds),
        space_delimited_claims=list(rule.space_delimited_claims),
    )


def request_authentication_to_proto(policy: RequestAuthentication) -> pb.RequestAuthentication:
    return pb.RequestAuthentication(
        name=policy.name,
        namespace=policy.namespace,
        rules=[_rule_to_proto(r) for r in policy.rules],
        services=list(policy.services),
    )


class RequestAuthReader(FieldReader):
    """Rules 1-5 for the RequestAuthentications of one resource."""

    def header_name(self, field: str, name: str) -> str:
        if not LOWER_TOKEN.fullmatch(name):
            raise self.fail(field, f"not a lower-case header name: {name!r}")
        return name

    def jwks(self, field: str, text: str) -> str:
        if len(text) > MAX_JWKS_BYTES:
            raise self.fail(field, f"longer than {MAX_JWKS_BYTES} bytes")
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):
            raise self.fail(field, "not JSON") from None
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise self.fail(field, "not a JSON Web Key Set (an object with a keys list)")
        return text

    def rule(self, field: str, message: pb.JwtRule) -> JwtRule:
        jwks, uri = message.jwks, message.jwks_uri
        if bool(jwks) == bool(uri):
            raise self.fail(f"{field}.jwks_uri", "exactly one of jwks and jwks_uri must be set")
        if uri:
            problem = jwks_uri_problem(uri)
            if problem is not None:
                raise self.fail(f"{field}.jwks_uri", problem)
        else:
            self.jwks(f"{field}.jwks", jwks)
        headers = []
        for i, h in enumerate(message.from_headers):
            prefix = h.prefix
            if any(c in prefix for c in "\r\n\0"):
                raise self.fail(f"{field}.from_headers[{i}].prefix", "may not hold CR, LF or NUL")
            headers.append(JwtHeader(self.header_name(f"{field}.from_headers[{i}].name", h.name), prefix))
        timeout = DEFAULT_TIMEOUT_SECONDS
        if message.HasField("timeout"):
            t = message.timeout
            if t.seconds < 0 or t.nanos < 0 or t.nanos >= 1_000_000_000 or (t.seconds == 0 and t.nanos == 0):
                raise self.fail(f"{field}.timeout", "must be a positive duration")
            timeout = (t.seconds * 1_000_000_000 + t.nanos) / 1_000_000_000
        payload = message.output_payload_to_header
        return JwtRule(
            issuer=self.text(f"{field}.issuer", message.issuer, required=True),
            audiences=tuple(
                self.text(f"{field}.audiences[{i}]", a, required=True) for i, a in enumerate(message.audiences)
            ),
            jwks=jwks,
            jwks_uri=uri,
            from_headers=tuple(headers),
            from_params=tuple(
                self.text(f"{field}.from_params[{i}]", p, required=True) for i, p in enumerate(message.from_params)
            ),
            from_cookies=tuple(
                self.text(f"{field}.from_cookies[{i}]", c, required=True) for i, c in enumerate(message.from_cookies)
            ),
            output_payload_to_header=self.header_name(f"{field}.output_payload_to_header", payload) if payload else "",
            output_claim_to_headers=tuple(
                ClaimToHeader(
                    self.header_name(f"{field}.output_claim_to_headers[{i}].header", c.header),
                    self.text(f"{field}.output_claim_to_headers[{i}].claim", c.claim, required=True),
                )
                for i, c in enumerate(message.output_claim_to_headers)
            ),
            forward_original_token=message.forward_original_token,
            timeout_seconds=timeout,
            space_delimited_claims=tuple(
                self.text(f"{field}.space_delimited_claims[{i}]", c, required=True)
                for i, c in enumerate(message.space_delimited_claims)
            ),
        )

    def request_authentication(self, field: str, message: pb.RequestAuthentication) -> RequestAuthentication:
        namespace = self.text(f"{field}.namespace", message.namespace, required=True)
        self.identity_part(f"{field}.namespace", namespace, "namespace")
        return RequestAuthentication(
            name=self.text(f"{field}.name", message.name, required=True),
            namespace=namespace,
            rules=tuple(self.rule(f"{field}.rules[{i}]", r) for i, r in enumerate(message.rules)),
            services=tuple(
                self.text(f"{field}.services[{i}]", s, required=True) for i, s in enumerate(message.services)
            ),
        )
