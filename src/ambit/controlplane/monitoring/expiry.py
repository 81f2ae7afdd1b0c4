"""When the mesh CA's certificates expire, as istiod reports them (``citadel_server_*_expiry_timestamp``).

The root's expiry is that of the first certificate of the trust bundle (during a root rotation the bundle holds
two). The signing CA's chain has an expiry only when the CA signs with an intermediate: istiod keeps no chain for
a self-signed root, and so reports none.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ambit.controlplane.ca.rootca import RootCa


def ca_expiry(root: RootCa) -> tuple[float, float | None]:
    """``(root not-after, signing CA not-after or None)`` in Unix seconds."""
    roots = x509.load_pem_x509_certificates(root.root_pem)
    signer = x509.load_pem_x509_certificate(root.signer.cert_pem)
    root_ders = {cert.public_bytes(serialization.Encoding.DER) for cert in roots}
    chain = None
    if signer.public_bytes(serialization.Encoding.DER) not in root_ders:
        chain = signer.not_valid_after_utc.timestamp()
    return roots[0].not_valid_after_utc.timestamp(), chain
