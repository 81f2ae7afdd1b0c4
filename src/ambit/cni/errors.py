"""Errors of the CNI plugin, each carrying the CNI error code the runtime sees.

The plugin turns every :class:`CniError` into the CNI error result ``{"cniVersion", "code", "msg", "details"}``
on stdout with a non-zero exit status. Codes are from the CNI specification ("Error" section)::

    AmbitError
    └── CniError                      999  internal error (anything unexpected)
        ├── IncompatibleVersionError    1  cniVersion not supported
        ├── InvalidEnvironmentError     4  a required CNI_* variable is missing or invalid
        ├── DecodingError               6  stdin is not a JSON object
        ├── InvalidConfigError          7  the network configuration is invalid (local misuse)
        └── TryAgainLaterError         11  transient: the runtime retries the ADD
            ├── KubeLookupError            the Pod or Namespace could not be read from the API server
            └── AgentError                 the node agent could not be reached or refused the pod

Stdlib-only: the plugin imports this at start-up.
"""

from __future__ import annotations

from ambit.errors import AmbitError


class CniError(AmbitError):
    """A CNI operation failed; ``code`` is the CNI wire code, ``details`` optional extra text."""

    code = 999

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details


class IncompatibleVersionError(CniError):
    code = 1


class InvalidEnvironmentError(CniError):
    code = 4


class DecodingError(CniError):
    code = 6


class InvalidConfigError(CniError):
    code = 7


class TryAgainLaterError(CniError):
    code = 11


class KubeLookupError(TryAgainLaterError):
    """Reading the Pod or Namespace failed (network, TLS, auth, or a non-200 answer)."""


class AgentError(TryAgainLaterError):
    """The node agent's plugin-event socket was unreachable or answered non-200."""
