"""The root of Ambit's exception tree.

Every error Ambit raises on purpose derives from :class:`AmbitError`, with a subtree per package::

    AmbitError
    ├── ApiError                 (ambit.apiserver.errors) a Kubernetes-style Status with a code and reason
    └── KubeClientError          (ambit.k8s.errors) a request to an API server failed
        └── KubeApiStatusError   the server answered with a Status

Blame is explicit: an error caused by what a peer sent says so in its class name or reason.
"""

from __future__ import annotations


class AmbitError(Exception):
    """Base class of every error Ambit raises on purpose."""
