"""Istio ``cacerts`` directories for the plug-in CA rotation tests: written whole, file by file, or swapped the way
a kubelet updates a Secret volume (``..data`` renamed over)."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ambit.tls.certs import KeyPair

NAMES = ("ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem")


def first_cert(pem: bytes) -> bytes:
    """The first certificate of a PEM bundle."""
    return x509.load_pem_x509_certificates(pem)[0].public_bytes(serialization.Encoding.PEM)


def cacerts_files(signer: KeyPair, roots: bytes) -> dict[str, bytes]:
    """Istio's four files for ``signer`` (``crl_pki.intermediate``: the intermediate then its root) and the trust
    bundle ``roots``."""
    return {
        "ca-cert.pem": first_cert(signer.cert_pem),
        "ca-key.pem": signer.key_pem,
        "cert-chain.pem": signer.cert_pem,
        "root-cert.pem": roots,
    }


def write_plain(directory: Path, files: dict[str, bytes]) -> None:
    """Each file replaced on its own (renamed over), in ``NAMES`` order."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        if name in files:
            staged = directory / f".{name}.new"
            staged.write_bytes(files[name])
            staged.replace(directory / name)


def write_volume(directory: Path, files: dict[str, bytes], generation: int) -> Path:
    """A Secret volume's layout: the files in ``..<generation>``, ``..data`` pointing at it (renamed over in one
    step), and each name a link through ``..data``; returns the new data directory."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"..{generation}"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    link = directory / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    return data
