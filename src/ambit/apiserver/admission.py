"""Dynamic admission: calling the webhooks of MutatingWebhookConfigurations and ValidatingWebhookConfigurations
the way kube-apiserver calls them.

Theory of operation. A write is described by one :class:`AdmissionAttributes`. The API server calls
:meth:`AdmissionController.mutate` first, validates the (possibly patched) object itself, then calls
:meth:`AdmissionController.validate`, and stores the object only if both returned. Which webhooks a request
goes to is decided by :func:`webhook_matches` (:mod:`ambit.apiserver.admission_match`); what is sent and how
answers are checked is :mod:`ambit.apiserver.admission_review`. This module is the I/O around them.

Rule 1, mutating webhooks run one at a time: configurations sorted by name, webhooks in their listed order, each
seeing the object as patched by the ones before. A webhook with ``reinvocationPolicy: IfNeeded`` is called once
more, after the first pass, if a webhook *after* it changed the object; the second pass calls only those (if
they still match) and there is never a third.

Rule 2, validating webhooks run concurrently and all are awaited. If several deny or fail, the first in
configuration order wins (kube-apiserver returns whichever finished first; ours is deterministic).

Rule 3, outcomes:

- denial (``allowed: false``): the webhook's Status, code at least 400 (400 when absent), message
  ``admission webhook "<name>" denied the request: <message>``;
- failure to call (refused, timeout, TLS, non-2xx, malformed or mismatched review, undecodable patch, a client
  configuration we cannot honour): ``failurePolicy: Fail`` (the default) raises 500 ``InternalError``
  ``Internal error occurred: failed calling webhook "<name>": <why>``; ``Ignore`` logs and skips the webhook;
- regardless of failurePolicy, as in kube-apiserver: a JSON patch that does not apply, or any patch for a
  request without an object (DELETE), is a 500; a dry-run request meeting a webhook whose ``sideEffects`` is
  neither ``None`` nor ``NoneOnDryRun`` is a 400.

Rule 4, warnings from every webhook called (even one that then denies) are returned deduplicated, in call order;
errors carry them as :attr:`AdmissionError.warnings` because kube-apiserver sends them on failures too.

Deliberate differences from kube-apiserver:

- ``matchPolicy: Equivalent`` is treated as ``Exact``: there are no equivalent resources to convert between.
- ``matchConditions`` (CEL) are not evaluated. A matching webhook that has them is skipped with a log warning
  when its failurePolicy is ``Ignore``, and fails the request with a 500 saying so when it is ``Fail``.
- Only ``admission.k8s.io/v1`` reviews are sent; a webhook whose ``admissionReviewVersions`` lacks ``v1`` fails
  per its failurePolicy. Only ``https`` endpoints are called. No client certificate is presented.

Invariants: the caller's objects are never mutated (patches build new values); the TLS name checked for a
Service reference is ``<name>.<namespace>.svc`` whatever address the resolver returns; a webhook's time budget
(``timeoutSeconds``, default 10, at most 30) covers connecting, sending and reading the answer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import json
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
from yarl import URL

from ambit.apiserver.admission_match import AdmissionAttributes, is_exempt, rule_matches, webhook_matches
from ambit.apiserver.admission_review import (
    WebhookCallError,
    WebhookResponse,
    build_admission_review,
    calling_error,
    denial_error,
    internal_error,
    read_admission_response,
)
from ambit.apiserver.errors import ApiError, bad_request
from ambit.apiserver.patch import json_patch

__all__ = [
    "AdmissionAttributes",
    "AdmissionController",
    "AdmissionError",
    "ServiceResolver",
    "is_exempt",
    "rule_matches",
    "webhook_matches",
]

log = logging.getLogger(__name__)

ServiceResolver = Callable[[str, str, int], "Awaitable[str] | str"]
"""``(namespace, name, port) -> base URL`` of a webhook Service, e.g. ``https://10.0.0.7:8443``."""

DEFAULT_TIMEOUT_SECONDS = 10
MAX_TIMEOUT_SECONDS = 30
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""A safety cap on a webhook's answer; a review holds an object or two, far smaller."""

WebhookKey = tuple[str, int]
"""A webhook's identity across the two mutating passes: (configuration name, index in it)."""


class AdmissionError(ApiError):
    """Admission refused the request; ``warnings`` are those the webhooks called so far returned."""

    def __init__(self, cause: ApiError, warnings: Sequence[str]) -> None:
        super().__init__(cause.code, cause.reason, cause.message, details=cause.details)
        self.warnings = list(warnings)


class AdmissionController:
    """Calls admission webhooks over HTTPS; owns an aiohttp session unless given one."""

    def __init__(
        self,
        *,
        service_resolver: ServiceResolver | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._resolver = service_resolver
        self._session = session
        self._owns_session = session is None
        self._ssl_contexts: dict[str, ssl.SSLContext] = {}

    async def __aenter__(self) -> AdmissionController:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def mutate(
        self, configs: Sequence[Mapping[str, Any]], attrs: AdmissionAttributes
    ) -> tuple[dict[str, Any] | None, list[str]]:
        """Run the mutating webhooks; returns the (possibly patched) object and the warnings."""
        warnings: list[str] = []
        obj = attrs.object
        if is_exempt(attrs):
            return obj, warnings
        hooks = _ordered_webhooks(configs)
        invoked_since_change: set[WebhookKey] = set()  # IfNeeded webhooks not followed by a change yet
        reinvoke: set[WebhookKey] = set()
        try:
            for key, hook in hooks:
                current = replace(attrs, object=obj)
                if not webhook_matches(hook, current) or _skip_for_match_conditions(hook):
                    continue
                changed, obj = await self._admit(hook, current, warnings)
                if changed:
                    reinvoke |= invoked_since_change
                    invoked_since_change.clear()
                if hook.get("reinvocationPolicy") == "IfNeeded":
                    invoked_since_change.add(key)
            for key, hook in hooks:
                if key not in reinvoke:
                    continue
                current = replace(attrs, object=obj)
                if not webhook_matches(hook, current) or _skip_for_match_conditions(hook):
                    continue
                _, obj = await self._admit(hook, current, warnings)
        except ApiError as exc:
            raise AdmissionError(exc, warnings) from exc
        return obj, warnings

    async def validate(self, configs: Sequence[Mapping[str, Any]], attrs: AdmissionAttributes) -> list[str]:
        """Run the validating webhooks concurrently; returns the warnings, raises :class:`AdmissionError`."""
        warnings: list[str] = []
        if is_exempt(attrs):
            return warnings
        try:
            hooks = [
                hook
                for _, hook in _ordered_webhooks(configs)
                if webhook_matches(hook, attrs) and not _skip_for_match_conditions(hook)
            ]
        except ApiError as exc:
            raise AdmissionError(exc, warnings) from exc
        outcomes = await asyncio.gather(*(self._validate_one(hook, attrs) for hook in hooks))
        for hook_warnings, _ in outcomes:
            _add_warnings(warnings, hook_warnings)
        for _, error in outcomes:
            if error is not None:
                raise AdmissionError(error, warnings) from error
        return warnings

    async def _validate_one(
        self, webhook: Mapping[str, Any], attrs: AdmissionAttributes
    ) -> tuple[tuple[str, ...], ApiError | None]:
        try:
            response = await self._call(webhook, attrs, mutating=False)
        except WebhookCallError as exc:
            try:
                _fail_or_ignore(webhook, exc)
            except ApiError as error:
                return (), error
            return (), None
        except ApiError as error:
            return (), error
        if not response.allowed:
            return response.warnings, denial_error(_name(webhook), response.status)
        return response.warnings, None

    async def _admit(
        self, webhook: Mapping[str, Any], attrs: AdmissionAttributes, warnings: list[str]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Call one mutating webhook; returns whether it changed the object, and the object."""
        try:
            response = await self._call(webhook, attrs, mutating=True)
            _add_warnings(warnings, response.warnings)
            if not response.allowed:
                raise denial_error(_name(webhook), response.status)
            return self._apply_patch(webhook, attrs.object, response)
        except WebhookCallError as exc:
            _fail_or_ignore(webhook, exc)
            return False, attrs.object

    @staticmethod
    def _apply_patch(
        webhook: Mapping[str, Any], obj: dict[str, Any] | None, response: WebhookResponse
    ) -> tuple[bool, dict[str, Any] | None]:
        if not response.patch:
            return False, obj
        try:
            operations = json.loads(response.patch)
        except ValueError as exc:
            raise WebhookCallError(f"received undecodable patch in webhook response: {exc}") from None
        if not isinstance(operations, list):
            raise WebhookCallError("received undecodable patch in webhook response: not a JSON array")
        if not operations:
            return False, obj
        if obj is None:
            raise internal_error(
                f'admission webhook "{_name(webhook)}" attempted to modify the object, '
                "which is not supported for this operation"
            )
        if response.patch_type != "JSONPatch":
            raise WebhookCallError(f'unsupported patch type "{response.patch_type}"')
        try:
            patched = json_patch(obj, operations)
        except ApiError as exc:
            raise internal_error(exc.message) from exc
        if not isinstance(patched, dict):
            raise internal_error(f'admission webhook "{_name(webhook)}" patched the object into a non-object')
        return patched != obj, patched

    async def _call(self, webhook: Mapping[str, Any], attrs: AdmissionAttributes, *, mutating: bool) -> WebhookResponse:
        if attrs.dry_run:
            side_effects = webhook.get("sideEffects")
            if side_effects is None:
                raise WebhookCallError("Webhook SideEffects is nil")
            if side_effects not in ("None", "NoneOnDryRun"):
                raise bad_request(f'admission webhook "{_name(webhook)}" does not support dry run')
        if "v1" not in (webhook.get("admissionReviewVersions") or ()):
            raise WebhookCallError("webhook does not accept known AdmissionReview versions (v1)")
        client_config = webhook.get("clientConfig")
        if not isinstance(client_config, Mapping):
            raise WebhookCallError("webhook has no clientConfig")
        budget = _timeout_seconds(webhook)
        url, server_hostname = await self._fetch_endpoint(client_config)
        context = self._find_ssl_context(client_config.get("caBundle"))
        uid = str(uuid.uuid4())
        body = json.dumps(build_admission_review(attrs, uid), separators=(",", ":")).encode()
        # kube-apiserver tells the webhook its budget, as client-go does for every request with a deadline.
        url = url.update_query(timeout=f"{budget}s")
        payload = await self._post(url, body, context, server_hostname, budget)
        return read_admission_response(payload, uid, mutating=mutating)

    async def _fetch_endpoint(self, client_config: Mapping[str, Any]) -> tuple[URL, str | None]:
        """The URL to POST to and, for a Service reference, the TLS name to verify."""
        url = client_config.get("url")
        service = client_config.get("service")
        if url:
            target, server_hostname = str(url), None
        elif isinstance(service, Mapping):
            namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
            port = service.get("port") or 443
            path = str(service.get("path") or "")
            # Kubernetes names the endpoint by its Service DNS name, whichever address it connects to.
            server_hostname = f"{name}.{namespace}.svc"
            shown = f"https://{server_hostname}:{port}{path}"
            if self._resolver is None:
                raise WebhookCallError(
                    f'failed to call webhook: Post "{shown}": service references are not supported '
                    "(no service resolver)"
                )
            try:
                base = self._resolver(namespace, name, int(port))
                if inspect.isawaitable(base):
                    base = await base
            except Exception as exc:  # the resolver is a seam: whatever it raises is a failure to call
                raise WebhookCallError(f'failed to call webhook: Post "{shown}": {exc}') from None
            target = str(base).rstrip("/") + (path if path.startswith("/") or not path else "/" + path)
        else:
            raise WebhookCallError("webhook clientConfig has neither url nor service")
        try:
            parsed = URL(target)
        except ValueError as exc:
            raise WebhookCallError(f"invalid webhook URL {target!r}: {exc}") from None
        if parsed.scheme != "https" or not parsed.host:
            raise WebhookCallError(f"webhook URL {target!r} is not an https URL")
        return parsed, server_hostname

    def _find_ssl_context(self, ca_bundle: Any) -> ssl.SSLContext:
        """One context per caBundle (base64 PEM); the system roots when there is none."""
        key = ca_bundle if isinstance(ca_bundle, str) else ""
        context = self._ssl_contexts.get(key)
        if context is not None:
            return context
        if key:
            try:
                pem = base64.b64decode(key, validate=True).decode("ascii")
                context = ssl.create_default_context(cadata=pem)
            except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
                raise WebhookCallError(f"invalid caBundle: {exc}") from None
        else:
            context = ssl.create_default_context()
        self._ssl_contexts[key] = context
        return context

    async def _post(
        self, url: URL, body: bytes, context: ssl.SSLContext, server_hostname: str | None, budget: int
    ) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json", "Accept": "application/json, */*"}
        try:
            async with (
                asyncio.timeout(budget),
                self._session.post(
                    url,
                    data=body,
                    headers=headers,
                    ssl=context,
                    server_hostname=server_hostname,
                    allow_redirects=False,
                ) as response,
            ):
                payload = await _read_limited(response)
                code = response.status
        except TimeoutError:
            raise WebhookCallError(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from None
        if not 200 <= code < 300:
            raise WebhookCallError(f"failed to call webhook: {_describe_http_error(code, payload)}")
        return payload


async def _read_limited(response: aiohttp.ClientResponse) -> bytes:
    data = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > MAX_RESPONSE_BYTES:
            raise WebhookCallError(f"failed to call webhook: response is larger than {MAX_RESPONSE_BYTES} bytes")
    return bytes(data)


def _describe_http_error(code: int, payload: bytes) -> str:
    """The message of a Status body when there is one, as client-go reports it; else an excerpt."""
    try:
        status = json.loads(payload)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status" and isinstance(status.get("message"), str):
        return f"the server responded with HTTP {code}: {status['message']}"
    excerpt = payload[:256].decode("utf-8", errors="replace").strip()
    return f"the server responded with HTTP {code}" + (f": {excerpt}" if excerpt else "")


def _fail_or_ignore(webhook: Mapping[str, Any], failure: WebhookCallError) -> None:
    """failurePolicy: raise a 500 for ``Fail`` (the default), log and carry on for ``Ignore``."""
    if webhook.get("failurePolicy") == "Ignore":
        log.warning('Failed calling webhook, failing open "%s": %s', _name(webhook), failure)
        return
    raise calling_error(_name(webhook), failure)


def _skip_for_match_conditions(webhook: Mapping[str, Any]) -> bool:
    """True to skip a webhook that has matchConditions (Ignore); raises for Fail; False when it has none."""
    if not webhook.get("matchConditions"):
        return False
    unsupported = WebhookCallError("matchConditions (CEL) are not supported by this API server")
    if webhook.get("failurePolicy") == "Ignore":
        log.warning('Skipping webhook "%s": %s', _name(webhook), unsupported)
        return True
    raise calling_error(_name(webhook), unsupported)


def _timeout_seconds(webhook: Mapping[str, Any]) -> int:
    value = webhook.get("timeoutSeconds")
    if not isinstance(value, int) or isinstance(value, bool):
        return DEFAULT_TIMEOUT_SECONDS
    return min(max(value, 1), MAX_TIMEOUT_SECONDS)


def _ordered_webhooks(configs: Sequence[Mapping[str, Any]]) -> list[tuple[WebhookKey, Mapping[str, Any]]]:
    """Every webhook with its key: configurations by name, webhooks in their order."""

    def name_of(config: Mapping[str, Any]) -> str:
        metadata = config.get("metadata")
        return str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""

    return [
        ((name_of(config), index), hook)
        for config in sorted(configs, key=name_of)
        for index, hook in enumerate(config.get("webhooks") or ())
    ]


def _add_warnings(sink: list[str], new: Sequence[str]) -> None:
    sink.extend(w for w in new if w and w not in sink)


def _name(webhook: Mapping[str, Any]) -> str:
    return str(webhook.get("name", ""))
