"""The mesh root: kept in a Secret or plugged in from files, and published to every namespace (spec §5.3).

Theory of operation. **Where the root comes from**, in istiod's two modes:

- Self-signed (default): the root's certificate and key live in Secret ``istio-ca-secret`` in ``istio-system``
  (data keys ``ca-cert.pem`` and ``ca-key.pem``). :func:`load_or_create_root_secret` reads it, or creates a fresh
  10-year root when there is none (creating ``istio-system`` first on a fresh cluster, or waiting for it when
  that is not allowed: :mod:`~ambit.controlplane.ca.home`). Two control planes racing to create it both end up
  with the one that won (the loser reads it back after ``AlreadyExists``), so a restart or a second replica never
  changes the root.
- Plug-in CA: :func:`load_plugin_ca` reads a signing certificate (optionally followed by its chain), its key, the
  chain file and the trust bundle (default: the chain's last certificate) from files, checked by
  :mod:`~ambit.controlplane.ca.rotation`, which also decides whether changed files are taken while running.

Either way the result is a :class:`RootCa`: the signer (which signs workload CSRs) and the root PEM (which
workloads trust and the CA appends last to every chain).

**Publishing.** :class:`RootCertPublisher` keeps ConfigMap ``istio-ca-root-cert`` with key ``root-cert.pem`` equal to
the root in every namespace (a :class:`~ambit.controlplane.ca.publish.ConfigMapPublisher`).

Invariants: a Secret that exists but cannot be read is an error (:class:`RootCaError`), never a reason to make a
new root: replacing a root that workloads trust would break every connection in the mesh.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509

from ambit.controlplane.ca.errors import RootCaError
from ambit.controlplane.ca.home import ensure_namespace
from ambit.controlplane.ca.publish import ConfigMapPublisher, Plan, config_map, plan_config_map
from ambit.controlplane.ca.rootca import RootCa
from ambit.controlplane.ca.rotation import CaFiles, plugin_ca_from_files
from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeNotFoundError
from ambit.k8s.kinds import SECRETS
from ambit.tls.certs import CertificateError, KeyPair, new_ca

log = logging.getLogger(__name__)

SYSTEM_NAMESPACE = "istio-system"
ROOT_SECRET = "istio-ca-secret"
SECRET_CERT_KEY = "ca-cert.pem"
SECRET_KEY_KEY = "ca-key.pem"
SECRET_TYPE = "istio.io/ca-root"
ROOT_CONFIG_MAP = "istio-ca-root-cert"
ROOT_CERT_KEY = "root-cert.pem"
ROOT_COMMON_NAME = "Ambit mesh root"
ROOT_ORGANIZATION = "cluster.local"
ROOT_DAYS = 3650


def root_secret(root: KeyPair, namespace: str = SYSTEM_NAMESPACE) -> dict[str, Any]:
    """The Secret object that stores a self-signed root."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ROOT_SECRET, "namespace": namespace},
        "type": SECRET_TYPE,
        "data": {
            SECRET_CERT_KEY: base64.b64encode(root.cert_pem).decode("ascii"),
            SECRET_KEY_KEY: base64.b64encode(root.key_pem).decode("ascii"),
        },
    }


def root_from_secret(secret: Mapping[str, Any]) -> RootCa:
    """Read a root Secret; :class:`RootCaError` names what is missing or malformed."""
    data = secret.get("data") or {}
    where = f"Secret {SYSTEM_NAMESPACE}/{ROOT_SECRET}"
    values: list[bytes] = []
    for key in (SECRET_CERT_KEY, SECRET_KEY_KEY):
        encoded = data.get(key)
        if not isinstance(encoded, str) or not encoded:
            raise RootCaError(f"{where} has no {key}")
        try:
            values.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            raise RootCaError(f"{where}: {key} is not base64") from None
    pair = KeyPair(cert_pem=values[0], key_pem=values[1])
    _check_ca(pair, where)
    return RootCa.self_signed(pair)


async def load_or_create_root_secret(
    client: KubeClient,
    *,
    namespace: str = SYSTEM_NAMESPACE,
    now: float | None = None,
    namespace_retry_delay: float = 2.0,
) -> RootCa:
    """The root kept in Secret ``istio-ca-secret``, created (fresh, self-signed) if there is none.

    On a fresh cluster the namespace is created first, or waited for when we may not create it
    (:func:`~ambit.controlplane.ca.home.ensure_namespace`).
    """
    try:
        return root_from_secret(await client.get(SECRETS, ROOT_SECRET, namespace))
    except KubeNotFoundError:
        pass
    except KubeClientError as exc:
        raise RootCaError(f"cannot read Secret {namespace}/{ROOT_SECRET}: {exc}") from None
    if await ensure_namespace(client, namespace, retry_delay=namespace_retry_delay) is False:
        # It existed all along, or another party made it while we waited: it may hold a root by now.
        with contextlib.suppress(KubeNotFoundError):
            return root_from_secret(await client.get(SECRETS, ROOT_SECRET, namespace))
    pair = new_ca(
        ROOT_COMMON_NAME, now=time.time() if now is None else now, days=ROOT_DAYS, organization=ROOT_ORGANIZATION
    )
    try:
        await client.create(SECRETS, root_secret(pair, namespace), namespace)
    except KubeAlreadyExistsError:
        log.info("another control plane created the root first; using its root")
        try:
            return root_from_secret(await client.get(SECRETS, ROOT_SECRET, namespace))
        except KubeClientError as exc:
            raise RootCaError(f"cannot read Secret {namespace}/{ROOT_SECRET}: {exc}") from None
    except KubeClientError as exc:
        raise RootCaError(f"cannot create Secret {namespace}/{ROOT_SECRET}: {exc}") from None
    log.info("created a new mesh root in Secret %s/%s", namespace, ROOT_SECRET)
    return RootCa.self_signed(pair)


def load_plugin_ca(
    cert_path: Path,
    key_path: Path,
    root_cert_path: Path | None = None,
    chain_path: Path | None = None,
    *,
    now: float | None = None,
) -> RootCa:
    """A plug-in CA: the signing certificate (then its chain) and key, the chain file, and the trust bundle
    (default: the chain's last); checked as a reload is (:func:`.rotation.plugin_ca_from_files`)."""
    try:
        files = CaFiles(
            cert=cert_path.read_bytes(),
            key=key_path.read_bytes(),
            chain=chain_path.read_bytes() if chain_path is not None else None,
            root=root_cert_path.read_bytes() if root_cert_path is not None else None,
        )
    except OSError as exc:
        raise RootCaError(f"cannot read the plug-in CA: {exc}") from None
    return plugin_ca_from_files(files, time.time() if now is None else now, where=f"{cert_path} and {key_path}")


def _check_ca(pair: KeyPair, where: str) -> None:
    try:
        pair.check()
        cert = pair.certificate
    except CertificateError as exc:
        raise RootCaError(f"{where}: {exc}") from None
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise RootCaError(f"{where}: the certificate is not a CA (BasicConstraints ca=True is missing)")


# -- publishing -----------------------------------------------------------------------------------------------


def root_config_map(namespace: str, root_pem: str) -> dict[str, Any]:
    """ConfigMap ``istio-ca-root-cert`` for ``namespace``."""
    return config_map(ROOT_CONFIG_MAP, namespace, ROOT_CERT_KEY, root_pem)


def plan_root_config_map(namespace: Mapping[str, Any] | None, current: Mapping[str, Any] | None, root_pem: str) -> Plan:
    """What to do so that ``namespace`` holds the right root ConfigMap (``current`` is what it holds now)."""
    return plan_config_map(namespace, current, ROOT_CERT_KEY, root_pem)


class RootCertPublisher(ConfigMapPublisher):
    """Keeps ``istio-ca-root-cert`` right in every namespace; ``async with`` it (or ``start``/``aclose``)."""

    def __init__(self, client: KubeClient, root_pem: bytes, *, retry_delay: float = 1.0) -> None:
        super().__init__(client, ROOT_CONFIG_MAP, ROOT_CERT_KEY, root_pem.decode("ascii"), retry_delay=retry_delay)

    def set_root(self, root_pem: bytes) -> None:
        """Publish another root (after a rotation) to every namespace."""
        self.set_value(root_pem.decode("ascii"))
