"""CNI errors: the CNI error format (``code``, ``msg``, ``details``), and the errors of Ambit's CNI plugin.

Ambit's plugin turns every :class:`CniError` into the CNI error result ``{"cniVersion", "code", "msg",
"details"}`` on stdout with a non-zero exit status; the lab's runtime (:mod:`ambit.lab.network.plugins`) reads the
same object from the plugins it runs into a :class:`CniError` carrying that plugin's code. Codes are from the CNI
specification ("Error" section)::

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
    """A CNI operation failed; ``code`` is the CNI wire code, ``details`` optional extra text.

    Each subclass fixes its code as a class attribute; ``code`` given here overrides it (an error object read from
    another plugin carries that plugin's code).
    """

    code = 999

    def __init__(self, msg: str, details: str = "", *, code: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details
        if code is not None:
            self.code = code


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
