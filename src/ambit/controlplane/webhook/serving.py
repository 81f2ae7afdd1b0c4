"""The validating webhook as the control plane runs it: its listener, its certificate from the mesh CA, and the
caBundle the API server trusts it with, all following a CA reload.

Theory of operation: :meth:`WebhookManager.start` issues a serving certificate from the CA's signer (names: the
address the API server dials and ``istiod.istio-system.svc``, or the installed Service's name), serves
``/validate`` with it, and either registers ``istio-validator-ambit`` with the trust bundle as caBundle, or, in a
cluster whose installer made that configuration, keeps its caBundle filled in (retrying until it exists, then
once a minute). :meth:`WebhookManager.rotate` does the same for a new CA: the caBundle becomes the new trust
bundle and the listener presents a certificate from the new signer from the next handshake on.

Invariant: during a root rotation done in its three steps (:mod:`ambit.controlplane.ca.rotation` rule 7) the
caBundle holds the root of the certificate presented at every step: step 1 adds the new root to the caBundle
before any certificate under it exists, and step 3 drops the old root only after step 2 moved the certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ambit.controlplane.ca.rootca import RootCa
from ambit.controlplane.webhook.errors import RegistrationError
from ambit.controlplane.webhook.registration import patch_ca_bundle, register_webhook
from ambit.controlplane.webhook.server import ValidationObserver, ValidationWebhookServer, WebhookServerSettings
from ambit.k8s import KubeClient
from ambit.model.dnsname import is_ip
from ambit.tls.certs import issue_server_cert

log = logging.getLogger(__name__)

KEEP_BUNDLE_EVERY = 60.0


class WebhookManager:
    """Owns the webhook's listener, certificate files and registration; ``start`` then ``aclose``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        host: str,
        port: int,
        dial: str,
        service: str | None = None,
        retry: float = 5.0,
        observer: ValidationObserver | None = None,
    ) -> None:
        """``dial`` is the address the API server reaches us at; ``service`` (``namespace/name``) the installed
        Service the configuration points at, when an installer made it (then only its caBundle is kept)."""
        self._client = client
        self._host, self._port, self._dial = host, port, dial
        self._service = service
        self._retry = retry
        self._observer = observer
        self._bundle = b""
        self._tasks: list[asyncio.Task[None]] = []
        self.server: ValidationWebhookServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url(self._dial)

    async def start(self, root: RootCa) -> None:
        with self._certificate_files(root) as (cert_file, key_file):
            self.server = ValidationWebhookServer(
                WebhookServerSettings(cert_file, key_file, host=self._host, port=self._port), observer=self._observer
            )
            await self.server.start()
        self._bundle = root.root_pem
        if self._service is not None:
            self._tasks.append(asyncio.create_task(self._keep_ca_bundle(), name="webhook caBundle"))
            return
        await register_webhook(self._client, self.url, root.root_pem)
        log.info("validating webhook at %s", self.url)

    def rotate(self, root: RootCa) -> None:
        """Trust bundle and certificate from a reloaded CA (call from the event loop)."""
        self._bundle = root.root_pem
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(self._update_ca_bundle(), name="webhook caBundle update"))
        if self.server is not None:
            with self._certificate_files(root) as (cert_file, key_file):
                self.server.reload_certificate(cert_file, key_file)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.aclose()

    @contextlib.contextmanager
    def _certificate_files(self, root: RootCa) -> Iterator[tuple[Path, Path]]:
        """A fresh serving certificate as files for as long as ssl needs to load them (it reads chains only from
        paths); they are removed at once, so a control plane that is killed leaves no key behind."""
        with tempfile.TemporaryDirectory(prefix="ambit-webhook-") as folder:
            yield self._write_certificate(root, Path(folder))

    def _write_certificate(self, root: RootCa, directory: Path) -> tuple[Path, Path]:
        names = [self._dial, "istiod.istio-system.svc"]
        if self._service is not None:
            namespace, _, name = self._service.partition("/")
            names = [f"{name}.{namespace}.svc"]
        pair = issue_server_cert(
            root.signer,
            common_name="istiod.istio-system.svc",
            dns_names=[n for n in names if not is_ip(n)],
            ip_addresses=[n for n in names if is_ip(n)],
            now=time.time(),
        )
        cert_file, key_file = directory / "tls.crt", directory / "tls.key"
        chain = pair.cert_pem + (root.signer.cert_pem if root.signer.cert_pem != root.root_pem else b"")
        key_file.touch(mode=0o600)
        key_file.write_bytes(pair.key_pem)
        cert_file.write_bytes(chain)
        return cert_file, key_file

    async def _update_ca_bundle(self) -> None:
        bundle = self._bundle
        while bundle == self._bundle:
            try:
                if self._service is not None:
                    await patch_ca_bundle(self._client, bundle)
                else:
                    await register_webhook(self._client, self.url, bundle)
            except RegistrationError as exc:
                log.warning("validating webhook: %s; trying again in %.0f s", exc, self._retry)
                await asyncio.sleep(self._retry)
                continue
            log.info("validating webhook: caBundle holds the reloaded CA's trust bundle")
            return

    async def _keep_ca_bundle(self) -> None:
        """Fill in the installed configuration's caBundle; retry until it exists, then every minute keep it so (a
        re-install may write the configuration again without it)."""
        while True:
            try:
                await patch_ca_bundle(self._client, self._bundle)
            except RegistrationError as exc:
                log.warning("validating webhook: %s; trying again in %.0f s", exc, self._retry)
                await asyncio.sleep(self._retry)
                continue
            await asyncio.sleep(KEEP_BUNDLE_EVERY)
