"""The model package's errors: one base, one class per kind of bad input or failed lookup.

::

    AmbitError
    └── ModelError
        ├── IdentityError            a string is not a well-formed SPIFFE id (ambit.model.identity)
        ├── AddressError             a string is not an IP or a "network/IP" address (ambit.model.workload)
        ├── LocalConfigError         a local config file is malformed; names the field (ambit.model.localconfig)
        ├── NoHealthyUpstreamError   a service is known but has no endpoint to dial (ambit.model.state)
        ├── UnknownWaypointError     a destination names a waypoint the state cannot resolve (ambit.model.state)
        ├── LuaSubsetError           Lua code outside the header-edit subset (ambit.model.lua_headers)
        ├── CronError                a cron schedule or time zone that cannot be used (ambit.model.cron)
        └── QuantityError            a string is not a Kubernetes resource quantity (ambit.model.quantity)

The first three blame whoever wrote the input (a peer's certificate, a config file); the last two are facts about
the mesh at the moment of the lookup: "no healthy upstream", and a waypoint that is missing or has no instance to
dial (the connection is refused rather than sent around the waypoint, as ztunnel does).
"""

from __future__ import annotations

from ambit.errors import AmbitError


class ModelError(AmbitError):
    """Base of the model package's errors."""


class IdentityError(ModelError):
    """A malformed SPIFFE id."""


class AddressError(ModelError):
    """A malformed IP address or ``network/IP`` string."""


class LocalConfigError(ModelError):
    """A malformed local config file. The message starts with the field path, e.g. ``workloads[2].uid: ...``."""


class NoHealthyUpstreamError(ModelError):
    """The destination is a known service with no (healthy) endpoint to dial."""


class UnknownWaypointError(ModelError):
    """A destination's waypoint is not in the state, or has no instance that can take HBONE on this network."""


class LuaSubsetError(ModelError):
    """Lua code outside the subset Ambit runs (header edits with string literals); says where and why."""


class CronError(ModelError, ValueError):
    """A CronJob schedule or time zone that cannot be used; the message says what is wrong, for a field error."""


class QuantityError(ModelError, ValueError):
    """Text that is not a Kubernetes resource quantity (``128Mi``); the message quotes it."""
