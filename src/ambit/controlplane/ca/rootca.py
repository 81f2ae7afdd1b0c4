"""The CA that signs workload certificates, as the CA service and the reload decision share it."""

from __future__ import annotations

from dataclasses import dataclass

from ambit.tls.certs import KeyPair


@dataclass(frozen=True, slots=True)
class RootCa:
    """The CA that signs workload certificates, and the roots workloads trust."""

    signer: KeyPair
    """Signing certificate (followed by its chain up to, not always including, the root) and its key."""
    root_pem: bytes
    """The trust bundle (one root, or several during a root rotation): published in every namespace and sent last
    in each issued chain."""

    @classmethod
    def self_signed(cls, pair: KeyPair) -> RootCa:
        return cls(signer=pair, root_pem=pair.cert_pem)
