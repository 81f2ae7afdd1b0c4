"""Ambit's native accelerator: whether it loaded, and whether this process uses it (issue 23).

Theory of operation: C sources next to this module are built by ``make install`` (``scripts/build_native.py``)
into extension modules; ``_tls_records`` is the TLS record path of :mod:`ambit.tls.native_transport`, and
``_hbone_data`` the DATA frames of attached HBONE streams parsed on that path (``hbone_data.c``; used only with the
records, by :class:`~ambit.proxy.hbone_session.HboneSession` on a native transport). Every
accelerated path has a pure-Python fallback that passes the same tests. The choice is made once per process, at
start-up, from the environment:

- ``AMBIT_NATIVE=0``: the pure-Python path, whether or not the extension is built;
- ``AMBIT_NATIVE=1``: the native path; a missing or unusable extension is a :class:`NativeError` at start-up;
- unset (or empty): the native path when the extension loads and passes its checks, else the pure-Python one.

Step 2 of the plan (docs/native-data-path.md: DATA frames of attached streams in C) is chosen by
``AMBIT_NATIVE_DATA=1``, which adds it to the native records; unset or ``0``, DATA frames stay in the Python engine.
The deployed node proxy sets it (deploy/base/ztunnel/daemonset.yaml, since the lab measured it: session 35); a
process started by hand keeps the Python engine unless asked. Step 3 (the relay's plain socket side in C,
``relay_socket.c``: a splice between a socket and an HBONE stream on that DATA path moves its bytes in C) comes with
step 2; ``AMBIT_NATIVE_RELAY=0`` leaves it out (the relay's Python callbacks, as at step 2). Tests and benchmarks select
both paths explicitly (:func:`use`).

The extension counts as usable only when it was built against the OpenSSL that Python's ``ssl`` runs (the same
``OPENSSL_VERSION_NUMBER``): it handles the ``SSL *`` objects of that library.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from ambit.errors import AmbitError

ENVIRONMENT = "AMBIT_NATIVE"
DATA_ENVIRONMENT = "AMBIT_NATIVE_DATA"
RELAY_ENVIRONMENT = "AMBIT_NATIVE_RELAY"
VERIFY_CACHE_ENVIRONMENT = "AMBIT_NATIVE_VERIFY_CACHE"


class NativeError(AmbitError):
    """``AMBIT_NATIVE`` asked for the native path and it cannot be used, or ``AMBIT_NATIVE`` is no 0 or 1."""


@dataclass(frozen=True, slots=True)
class NativeSelection:
    """The data path this process runs: ``tls_records`` is the extension module, or None on the pure-Python path."""

    tls_records: ModuleType | None
    reason: str
    """Why, in a few words (for the start-up log line and the config dump)."""
    hbone_data: ModuleType | None = None
    """``_hbone_data``, where it loads and the records are native; None: DATA frames stay in the Python engine."""
    relay_sockets: ModuleType | None = None
    """``_hbone_data`` again where the relay's plain socket side runs in C too (step 3: its ``SocketSink`` and
    ``SocketReader``); None: the relay's Python callbacks. Only with ``hbone_data``."""
    verify_cache: bool = True
    """Whether HBONE contexts cache their chain verifications (``verify_cache.c``; only with ``tls_records``)."""

    @property
    def verification_cache(self) -> ModuleType | None:
        """The module whose ``cache_verification`` HBONE contexts call, or None: every chain verified in full."""
        return self.tls_records if self.verify_cache else None

    @property
    def name(self) -> str:
        return "native" if self.tls_records is not None else "python"

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def load_tls_records() -> tuple[ModuleType | None, str]:
    """The extension module, or None and why not."""
    try:
        from ambit.native import _tls_records
    except ImportError as exc:
        return None, f"the extension is not built or does not load: {exc}"
    if _tls_records.OPENSSL_VERSION_NUMBER != ssl.OPENSSL_VERSION_NUMBER:
        return None, (
            f"the extension's OpenSSL {_tls_records.OPENSSL_VERSION_NUMBER:#x} is not Python's "
            f"{ssl.OPENSSL_VERSION_NUMBER:#x}"
        )
    return _tls_records, f"TLS records in C, {os.path.basename(_tls_records.__file__ or '?')}"


def load_hbone_data() -> ModuleType | None:
    """``_hbone_data``, or None where it is not built or does not load."""
    try:
        from ambit.native import _hbone_data
    except ImportError:
        return None
    return _hbone_data


def select(environ: Mapping[str, str]) -> NativeSelection:
    """The data path ``environ`` asks for (see the module docstring); :class:`NativeError` when it cannot be had."""
    setting = environ.get(ENVIRONMENT, "")
    if setting not in ("", "0", "1"):
        raise NativeError(f"{ENVIRONMENT}={setting!r}: expected 0 (pure Python), 1 (native) or unset")
    data_setting = environ.get(DATA_ENVIRONMENT, "")
    if data_setting not in ("", "0", "1"):
        raise NativeError(f"{DATA_ENVIRONMENT}={data_setting!r}: expected 1 (DATA frames in C), 0 or unset")
    relay_setting = environ.get(RELAY_ENVIRONMENT, "")
    if relay_setting not in ("", "0", "1"):
        raise NativeError(f"{RELAY_ENVIRONMENT}={relay_setting!r}: expected 0 (the relay in Python), 1 or unset")
    cache_setting = environ.get(VERIFY_CACHE_ENVIRONMENT, "")
    if cache_setting not in ("", "0", "1"):
        raise NativeError(f"{VERIFY_CACHE_ENVIRONMENT}={cache_setting!r}: expected 0 (verify every chain), 1 or unset")
    chosen = _select(setting, data_setting, relay_setting)
    if cache_setting == "0" and chosen.tls_records is not None:
        return dataclasses.replace(chosen, reason=chosen.reason + ", no verification cache", verify_cache=False)
    return chosen


def _select(setting: str, data_setting: str, relay_setting: str) -> NativeSelection:
    if setting == "0":
        return NativeSelection(None, f"{ENVIRONMENT}=0")
    module, reason = load_tls_records()
    if module is None and setting == "1":
        raise NativeError(f"{ENVIRONMENT}=1 but the native accelerator cannot be used: {reason}")
    if module is None:
        return NativeSelection(None, reason)
    if data_setting != "1":
        return NativeSelection(module, reason + ", HBONE DATA frames in Python")
    hbone_data = load_hbone_data()
    if hbone_data is None:
        raise NativeError(f"{DATA_ENVIRONMENT}=1 but the native HBONE DATA path (_hbone_data) is not built")
    if relay_setting == "0":
        return NativeSelection(module, reason + ", HBONE DATA frames in C, relay sockets in Python", hbone_data)
    return NativeSelection(module, reason + ", HBONE DATA frames in C, relay sockets in C", hbone_data, hbone_data)


_selection: NativeSelection | None = None


def selection() -> NativeSelection:
    """This process's data path, decided from ``os.environ`` on the first call (start-up) and kept."""
    global _selection
    if _selection is None:
        _selection = select(os.environ)
    return _selection


def use(chosen: NativeSelection | None) -> None:
    """Set this process's data path (tests and benchmarks compare both); None: decide again on the next call."""
    global _selection
    _selection = chosen
