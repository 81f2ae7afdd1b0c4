"""Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient.

Errors form one tree rooted at :class:`ambit.errors.AmbitError`.

Two versions, for two readers:

- :data:`__version__` is Ambit's own build: ``ambit version``, the ``istio_build`` metrics, the xDS ``Node``'s
  ``build_version`` (``ambit/<version>``) and the control plane's ``/version``.
- :data:`ISTIO_VERSION` is the Istio release whose APIs Ambit implements. Ambit's proxies state it as the
  ``ISTIO_VERSION`` node metadata, as Istio's proxies state theirs, and that is what an EnvoyFilter's
  ``match.proxy.proxyVersion`` (a regular expression) is matched against, and what ``ambit proxy-status`` shows.

Why the Istio version there, and not Ambit's: users pin EnvoyFilters to the Istio minor their patches were
written for (``^1\\.2[0-9].*`` and ``^1\\.32.*`` are common), because the configuration a patch edits changes
between Istio releases. Ambit's translation of those patches follows one release's generated configuration (route
configuration and virtual host names, filter order, contexts), the one in the upstream reference it was built
against. So a filter pinned to that minor is one whose patches Ambit interprets as its author meant, and a filter
pinned to another minor is written for a configuration Ambit does not reproduce and must not apply, as it would
not on an Istio proxy of that release. Stating ``0.1.0`` made every pinned filter silently inert. The value is a
release form (``1.32.0``, not the reference branch's ``1.32-dev``) so that patterns written against released
proxies (``^1\\.32\\.\\d+``) match. It changes when Ambit follows a newer Istio release, in this one place.
"""

from __future__ import annotations

__version__ = "0.1.0"

ISTIO_VERSION = "1.32.0"
"""The Istio release whose APIs Ambit implements (see the module docstring)."""
