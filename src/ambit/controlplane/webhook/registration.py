"""Registering the webhook with the API server: the ValidatingWebhookConfiguration ``istio-validator-ambit``.

Theory of operation. :func:`webhook_configuration` builds the object (pure): one webhook,
``validation.istio.io``, called at ``url`` and trusting ``ca_bundle``, for CREATE and UPDATE of every kind in
:data:`~ambit.controlplane.webhook.validation.VALIDATORS` (all versions), ``failurePolicy: Fail`` (an
unreachable validator refuses Istio config rather than letting it through), ``sideEffects: None``,
``admissionReviewVersions: [v1]``. :func:`register_webhook` writes it: create, or on conflict with an existing
one replace it at its current resourceVersion, retrying a few times if another writer got in between. It is
idempotent, so the control plane calls it at every start (a new serving certificate means a new caBundle).
"""

from __future__ import annotations

import base64
from typing import Any

from ambit.controlplane.webhook.errors import RegistrationError
from ambit.controlplane.webhook.validation import VALIDATORS
from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeApiStatusError, KubeClientError
from ambit.k8s.kinds import VALIDATING_WEBHOOK_CONFIGURATIONS

CONFIGURATION_NAME = "istio-validator-ambit"
WEBHOOK_NAME = "validation.istio.io"

_PLURALS = {
    "AuthorizationPolicy": "authorizationpolicies",
    "PeerAuthentication": "peerauthentications",
    "RequestAuthentication": "requestauthentications",
    "ServiceEntry": "serviceentries",
    "WorkloadEntry": "workloadentries",
    "DestinationRule": "destinationrules",
    "VirtualService": "virtualservices",
    "Sidecar": "sidecars",
    "EnvoyFilter": "envoyfilters",
    "Telemetry": "telemetries",
    "Gateway": "gateways",
    "HTTPRoute": "httproutes",
    "GRPCRoute": "grpcroutes",
    "TCPRoute": "tcproutes",
    "TLSRoute": "tlsroutes",
}


def webhook_configuration(url: str, ca_bundle: bytes, *, timeout_seconds: int = 10) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration; ``ca_bundle`` is PEM (it is base64-encoded here, as the API wants)."""
    groups: dict[str, list[str]] = {}
    for group, kind in VALIDATORS:
        groups.setdefault(group, []).append(_PLURALS[kind])
    rules = [
        {
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [group],
            "apiVersions": ["*"],
            "resources": sorted(resources),
            "scope": "*",
        }
        for group, resources in sorted(groups.items())
    ]
    return {
        "apiVersion": VALIDATING_WEBHOOK_CONFIGURATIONS.api_version,
        "kind": VALIDATING_WEBHOOK_CONFIGURATIONS.kind,
        "metadata": {"name": CONFIGURATION_NAME, "labels": {"app": "istiod", "app.kubernetes.io/part-of": "ambit"}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
                "rules": rules,
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": timeout_seconds,
            }
        ],
    }


async def register_webhook(
    client: KubeClient, url: str, ca_bundle: bytes, *, timeout_seconds: int = 10, attempts: int = 5
) -> dict[str, Any]:
    """Update ``istio-validator-ambit``, or create it when there is none; returns the stored object. Raises
    :class:`RegistrationError`.

    Update first: an installer (or the lab's set-up) creates the configuration, and the control plane's RBAC then
    needs only ``update`` on that one name, not ``create`` (which RBAC cannot restrict to a name)."""
    desired = webhook_configuration(url, ca_bundle, timeout_seconds=timeout_seconds)
    kind = VALIDATING_WEBHOOK_CONFIGURATIONS
    last: Exception | None = None
    for _ in range(attempts):
        try:
            try:
                current = await client.get(kind, CONFIGURATION_NAME)
            except KubeApiStatusError as exc:
                if not exc.is_not_found:
                    raise
                return await client.create(kind, desired)
            update = dict(desired, metadata=dict(current.get("metadata", {}), **desired["metadata"]))
            return await client.replace(kind, update)
        except KubeApiStatusError as exc:
            if not (exc.is_conflict or exc.is_not_found or exc.is_already_exists):
                raise RegistrationError(f"cannot register webhook {CONFIGURATION_NAME}: {exc}") from exc
            last = exc
        except KubeClientError as exc:
            raise RegistrationError(f"cannot register webhook {CONFIGURATION_NAME}: {exc}") from exc
    raise RegistrationError(f"cannot register webhook {CONFIGURATION_NAME}: kept conflicting ({last})")


async def unregister_webhook(client: KubeClient) -> None:
    """Delete ``istio-validator-ambit`` if it exists."""
    try:
        await client.delete(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    except KubeApiStatusError as exc:
        if not exc.is_not_found:
            raise RegistrationError(f"cannot delete webhook {CONFIGURATION_NAME}: {exc}") from exc
    except KubeClientError as exc:
        raise RegistrationError(f"cannot delete webhook {CONFIGURATION_NAME}: {exc}") from exc


def with_ca_bundle(configuration: dict[str, Any], ca_bundle: bytes) -> dict[str, Any]:
    """``configuration`` with every webhook trusting ``ca_bundle`` and failing closed (pure; a copy)."""
    out = dict(configuration)
    encoded = base64.b64encode(ca_bundle).decode()
    webhooks = []
    for hook in configuration.get("webhooks") or ():
        if isinstance(hook, dict):
            config = dict(hook.get("clientConfig") or {}, caBundle=encoded)
            webhooks.append(dict(hook, clientConfig=config, failurePolicy="Fail"))
        else:
            webhooks.append(hook)
    out["webhooks"] = webhooks
    return out


async def patch_ca_bundle(client: KubeClient, ca_bundle: bytes, *, attempts: int = 5) -> dict[str, Any]:
    """In a cluster, the installer creates ``istio-validator-ambit`` (pointing at the istiod Service); the control
    plane only fills in the caBundle of its serving certificate's root and turns it to fail closed, as istiod's
    webhook controller does. Replaced at its current resourceVersion, retried on conflict; a missing configuration
    is a :class:`RegistrationError` (the caller retries later)."""
    kind = VALIDATING_WEBHOOK_CONFIGURATIONS
    last: Exception | None = None
    for _ in range(attempts):
        try:
            current = await client.get(kind, CONFIGURATION_NAME)
            desired = with_ca_bundle(current, ca_bundle)
            if desired == current:
                return current
            return await client.replace(kind, desired)
        except KubeApiStatusError as exc:
            if exc.is_not_found:
                raise RegistrationError(f"{CONFIGURATION_NAME} does not exist yet (the installer creates it)") from exc
            if not exc.is_conflict:
                raise RegistrationError(f"cannot patch webhook {CONFIGURATION_NAME}: {exc}") from exc
            last = exc
        except KubeClientError as exc:
            raise RegistrationError(f"cannot patch webhook {CONFIGURATION_NAME}: {exc}") from exc
    raise RegistrationError(f"cannot patch webhook {CONFIGURATION_NAME}: kept conflicting ({last})")
