"""The HTTPS server the API server calls: ``POST /validate`` with an AdmissionReview v1 (spec §10.4).

Theory of operation. A thin aiohttp shell around :mod:`ambit.controlplane.webhook.review`: read the body (at most
``max_body_bytes``), parse, decide, answer JSON. A body that is not an AdmissionReview is answered 400 with a
one-line plain-text reason; nothing a caller posts produces a traceback, and an unexpected failure inside the
decision is logged and answered 500 without details. ``GET /ready`` answers 200 for probes.

The server owns its listening socket: bind happens in :meth:`ValidationWebhookServer.start`, so ``port=0`` picks
a free port and :attr:`ValidationWebhookServer.port` tells which. It owns every connection it accepts too
(:class:`~ambit.tls.listener.TlsListener`): :meth:`ValidationWebhookServer.aclose` returns with all of them
closed, also the keep-alive connection of an API server that does not answer TLS close_notify. TLS is mandatory,
because kube-apiserver only calls webhooks over https; the certificate must name the address in the registered
URL.

An injected :class:`ValidationObserver` (the control plane's monitoring) is told of each review that passed and of
each that did not, with the reason (:func:`~ambit.controlplane.webhook.review.verdict`); dry runs are not counted,
as istiod does not count them.
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from aiohttp import web

from ambit.controlplane.webhook.errors import MalformedReviewError
from ambit.controlplane.webhook.review import API_VERSION, ReviewRequest, parse_review, verdict
from ambit.tls.listener import TlsListener

log = logging.getLogger("ambit.controlplane.webhook")

VALIDATE_PATH = "/validate"
MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WebhookServerSettings:
    """Where and how the webhook listens."""

    cert_file: Path
    """PEM server certificate (chain), naming the host of the registered URL."""
    key_file: Path
    """PEM private key of ``cert_file``."""
    host: str = "0.0.0.0"
    port: int = 15017
    """istiod's webhook port; 0 picks a free one."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest review accepted; Kubernetes objects are at most 1.5 MiB, reviews can carry two of them."""


class ValidationObserver(Protocol):
    """What the webhook reports for metrics (istiod's ``galley_validation_*``)."""

    def validation_passed_for(self, group: str, version: str, resource: str) -> None: ...
    def validation_failed_for(self, group: str, version: str, resource: str, reason: str) -> None: ...


OBSERVER = web.AppKey[ValidationObserver | None]("observer")


def _report(observer: ValidationObserver | None, review: ReviewRequest, reason: str) -> None:
    if observer is None or review.dry_run:
        return
    if reason:
        observer.validation_failed_for(*review.resource, reason)
    else:
        observer.validation_passed_for(*review.resource)


async def _validate(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.read()
        review = parse_review(body)
    except web.HTTPRequestEntityTooLarge:
        return web.Response(status=413, text="AdmissionReview too large\n")
    except MalformedReviewError as exc:
        return web.Response(status=exc.http_status, text=f"{exc}\n")
    try:
        response, reason = verdict(review)
    except Exception:
        log.exception("validating %s %s failed", review.operation, review.kind)
        return web.Response(status=500, text="internal error while validating; see the webhook's log\n")
    _report(request.app[OBSERVER], review, reason)
    if not response["allowed"]:
        log.info("denied %s %s: %s", review.operation, review.kind, response["status"]["message"])
    return web.json_response({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})


async def _ready(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok\n")


def build_app(max_body_bytes: int = MAX_BODY_BYTES, observer: ValidationObserver | None = None) -> web.Application:
    """The aiohttp application (routes only; no listener)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[OBSERVER] = observer
    app.router.add_post(VALIDATE_PATH, _validate)
    app.router.add_get("/ready", _ready)
    return app


class ValidationWebhookServer:
    """The webhook listener; ``async with`` it, or ``start()`` and ``aclose()``."""

    def __init__(self, settings: WebhookServerSettings, *, observer: ValidationObserver | None = None) -> None:
        self.settings = settings
        self._observer = observer
        self._runner: web.AppRunner | None = None
        self._listener: TlsListener | None = None
        self._context: ssl.SSLContext | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._listener is None:
            raise RuntimeError("the webhook server is not started")
        return self._listener.address[1]

    def url(self, host: str) -> str:
        """The ``/validate`` URL as reached at ``host`` (which the certificate must name)."""
        shown = f"[{host}]" if ":" in host else host
        return f"https://{shown}:{self.port}{VALIDATE_PATH}"

    async def start(self) -> None:
        context = self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.settings.cert_file, self.settings.key_file)
        family = socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.settings.host, self.settings.port))
            runner = web.AppRunner(
                build_app(self.settings.max_body_bytes, self._observer), shutdown_timeout=1.0, access_log=None
            )
            await runner.setup()
        except BaseException:
            sock.close()
            raise
        assert runner.server is not None  # set by setup()
        listener = TlsListener(sock, runner.server, context, name="validation webhook")
        listener.start()
        self._listener, self._runner = listener, runner
        log.info("validation webhook listening on %s:%d", self.settings.host, self.port)

    def reload_certificate(self, cert_file: Path | None = None, key_file: Path | None = None) -> None:
        """Present the certificate the given files (by default the settings' files) hold now, from the next
        handshake on (a CA reload)."""
        if self._context is not None:
            self._context.load_cert_chain(cert_file or self.settings.cert_file, key_file or self.settings.key_file)

    async def aclose(self) -> None:
        """Stop accepting, finish or close every request and connection (aborting any still open after 1 s)."""
        runner, listener = self._runner, self._listener
        self._runner = self._listener = None
        if listener is not None:
            await listener.stop()
        if runner is not None:
            await runner.cleanup()
        if listener is not None:
            await listener.aclose(grace=1.0)

    async def __aenter__(self) -> ValidationWebhookServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
