"""The xds package's errors.

::

    AmbitError
    └── XdsError
        ├── XdsConversionError   a resource cannot be converted; names the resource and the field (peer's fault)
        ├── XdsProtocolError     a peer broke the delta xDS protocol (peer's fault)
        ├── XdsConfigFileError   the client's root certificate or token file cannot be read (local fault)
        └── GrpcCallError        a gRPC call of our channel failed: its status code and message

A conversion error on the client becomes a NACK of that one resource; the rest of the response still applies.
"""

from __future__ import annotations

from ambit.errors import AmbitError
from ambit.hbone.grpc_calls import StatusCode


class XdsError(AmbitError):
    """Base of the xds package's errors."""


class XdsConversionError(XdsError):
    """A resource that cannot be converted. The message starts with the resource name, then the field."""

    def __init__(self, resource: str, field: str, problem: str) -> None:
        super().__init__(f"{resource or '(unnamed)'}: {field}: {problem}")
        self.resource = resource
        self.field = field
        self.problem = problem


class XdsProtocolError(XdsError):
    """The peer sent something the delta xDS protocol does not allow."""


class XdsConfigFileError(XdsError):
    """The client's root certificate or token file cannot be read."""


class GrpcCallError(XdsError):
    """A gRPC call failed (:mod:`ambit.xds.grpc_channel`): ``code`` and ``details`` as gRPC states them, one line."""

    def __init__(self, code: StatusCode, details: str, pushback: float | None = None) -> None:
        super().__init__(f"{code.name}: {details}" if details else code.name)
        self.code = code
        self.details = details
        self.pushback = pushback
        """Seconds the server asked us to wait before trying again (its ``grpc-retry-pushback-ms``), if it did."""
