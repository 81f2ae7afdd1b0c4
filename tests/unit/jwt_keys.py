"""Signing keys made in the test run (never committed) and tokens signed with them, for the JWT tests."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm


@dataclass(frozen=True)
class Signer:
    """One private key with its public JWK; ``sign`` makes a token with the given claims."""

    alg: str
    private: Any
    jwk: dict[str, Any]

    def sign(self, claims: dict[str, Any], *, kid: str | None = None, alg: str | None = None) -> str:
        headers = {"kid": self.jwk.get("kid", "") if kid is None else kid}
        return jwt.encode(claims, self.private, algorithm=alg or self.alg, headers=headers)

    def jwks(self, **extra: Any) -> str:
        return json.dumps({"keys": [{**self.jwk, **extra}]})


def rsa_signer(kid: str = "") -> Signer:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = dict(RSAAlgorithm.to_jwk(private.public_key(), as_dict=True))
    jwk["kid"] = kid or uuid.uuid4().hex
    return Signer("RS256", private, jwk)


def ec_signer(kid: str = "") -> Signer:
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = dict(ECAlgorithm.to_jwk(private.public_key(), as_dict=True))
    jwk["kid"] = kid or uuid.uuid4().hex
    return Signer("ES256", private, jwk)


def ed25519_signer(kid: str = "") -> Signer:
    private = ed25519.Ed25519PrivateKey.generate()
    jwk = dict(OKPAlgorithm.to_jwk(private.public_key(), as_dict=True))
    jwk["kid"] = kid or uuid.uuid4().hex
    return Signer("EdDSA", private, jwk)


def claims(issuer: str, subject: str = "alice", now: float = 1_000_000.0, **extra: Any) -> dict[str, Any]:
    return {"iss": issuer, "sub": subject, "iat": int(now), "exp": int(now) + 3600, **extra}
