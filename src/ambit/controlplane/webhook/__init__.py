"""istiod's validating admission webhook for the Istio and Gateway API kinds Ambit reads (spec §10.4).

Modules: :mod:`fields` (walking untrusted JSON, :class:`FieldError`), one validator module per family
(:mod:`authorization`, :mod:`authentication`, :mod:`serviceentry`, :mod:`traffic`, :mod:`gateway`,
:mod:`envoyfilter`, with :mod:`attachment` for selector/targetRefs), :mod:`validation` (the kind table and
:func:`validate`), :mod:`review` (AdmissionReview in and out, no I/O), :mod:`server` (the aiohttp HTTPS shell)
and :mod:`registration` (the ValidatingWebhookConfiguration).
"""

from __future__ import annotations

from ambit.controlplane.webhook.errors import (
    MalformedReviewError,
    RegistrationError,
    UnknownKindError,
    WebhookError,
)
from ambit.controlplane.webhook.fields import FieldError
from ambit.controlplane.webhook.registration import (
    CONFIGURATION_NAME,
    WEBHOOK_NAME,
    register_webhook,
    unregister_webhook,
    webhook_configuration,
)
from ambit.controlplane.webhook.review import ReviewRequest, answer, decide, parse_review
from ambit.controlplane.webhook.server import ValidationWebhookServer, WebhookServerSettings, build_app
from ambit.controlplane.webhook.validation import VALIDATORS, invalid_message, validate

__all__ = [
    "CONFIGURATION_NAME",
    "VALIDATORS",
    "WEBHOOK_NAME",
    "FieldError",
    "MalformedReviewError",
    "RegistrationError",
    "ReviewRequest",
    "UnknownKindError",
    "ValidationWebhookServer",
    "WebhookError",
    "WebhookServerSettings",
    "answer",
    "build_app",
    "decide",
    "invalid_message",
    "parse_review",
    "register_webhook",
    "unregister_webhook",
    "validate",
    "webhook_configuration",
]
