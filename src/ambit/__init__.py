"""Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient.

Errors form one tree rooted at :class:`ambit.errors.AmbitError`.
"""

from __future__ import annotations

__version__ = "0.1.0"
