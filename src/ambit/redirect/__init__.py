"""Traffic redirection for in-pod mode: pure rule rendering (nftables, iptables, policy routes) and applying it.

Modules, in layer order:

- :mod:`.settings`: :class:`InPodSettings`, one pod's redirection settings (ports, marks, routes) and the pod
  annotations that change them;
- :mod:`.nftables`, :mod:`.iptables`, :mod:`.routes`: pure rendering, text or argv out, no I/O;
- :mod:`.apply`: runs the rendered rules in a network namespace through a command runner.

Errors (``AmbitError`` subtree)::

    RedirectError
    ├── RedirectSettingsError   a pod annotation or setting is unusable (the pod's fault, never retried)
    └── RedirectApplyError      a command that installs or removes rules failed (the machine's answer attached)
"""

from __future__ import annotations

from ambit.redirect.errors import RedirectApplyError, RedirectError, RedirectSettingsError
from ambit.redirect.settings import InPodSettings

__all__ = ["InPodSettings", "RedirectApplyError", "RedirectError", "RedirectSettingsError"]
