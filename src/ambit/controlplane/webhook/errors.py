"""Errors of the validation webhook (a subtree of :class:`ambit.errors.AmbitError`)::

    WebhookError
    ├── UnknownKindError       a kind this webhook has no validator for (local misuse)
    ├── MalformedReviewError   the caller posted something that is not an AdmissionReview v1 (peer's fault)
    └── RegistrationError      the ValidatingWebhookConfiguration could not be written

A validator never raises for a bad object: what is wrong with an object is data (``FieldError``), not an error.
"""

from __future__ import annotations

from ambit.errors import AmbitError


class WebhookError(AmbitError):
    """Base class of the webhook's errors."""


class UnknownKindError(WebhookError):
    """``validate`` was asked about a kind it does not know."""


class MalformedReviewError(WebhookError):
    """The request body is not an AdmissionReview v1 with a request; the server answers 400 with this text."""

    http_status = 400


class RegistrationError(WebhookError):
    """Creating or updating the ValidatingWebhookConfiguration failed."""
