"""A pod's service-account files (rule 2 of :mod:`ambit.lab.runtime.pod_worker`), and their removal with the pod.

Theory of operation. Unless ``automountServiceAccountToken`` is false, the pod worker asks :class:`ServiceAccountToken`
for a token bound to the pod before any container starts, and again at ``token_refresh_fraction`` of its lifetime.
The token, the pod's namespace and the cluster's CA bundle (the ``kube-root-ca.crt`` ConfigMap of the namespace, when
there is one) are written to ``<pods_dir>/<uid>/serviceaccount/``, which containers see at
``/var/run/secrets/kubernetes.io/serviceaccount``. Each file is replaced atomically: a reader sees the old or the new
content, never a part. A failure is a Warning ``FailedMount`` Event and is tried again after a back-off
(``sandbox_backoff_initial`` doubling to ``sandbox_backoff_max``), as the sandbox is.

:func:`forget_pod_files` removes what a gone pod left: its record (``runtime.json``), its service-account files, its
user-namespace note and its volumes; its logs stay.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambit.k8s import kinds
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.lab.runtime.containers import parse_rfc3339
from ambit.lab.runtime.containers_apply import EventType
from ambit.lab.runtime.pod_record import STATE_FILE
from ambit.lab.runtime.userns import USERNS_FILE
from ambit.lab.runtime.volumes_apply import remove_volumes

if TYPE_CHECKING:
    from ambit.lab.runtime.pod_host import PodHost

ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"


class ServiceAccountToken:
    """Rule 2: the token bound to one pod, with its namespace and CA bundle, under the pod's directory."""

    def __init__(
        self,
        runtime: PodHost,
        pod: Callable[[], Mapping[str, Any]],
        directory: Path,
        event: Callable[[EventType, str, str], None],
    ) -> None:
        self.runtime = runtime
        self.pod = pod
        """The pod as the informer last saw it."""
        self.directory = directory
        self.event = event
        self.written = False
        """A token was written: containers get ``AMBIT_TOKEN_FILE``."""

    @property
    def service_account_dir(self) -> Path:
        """``token``, ``ca.crt`` and ``namespace``: bound at ``/var/run/secrets/kubernetes.io/serviceaccount``."""
        return self.directory / "serviceaccount"

    @property
    def token_path(self) -> Path:
        return self.service_account_dir / "token"

    @property
    def namespace(self) -> str:
        return str((self.pod().get("metadata") or {}).get("namespace") or "")

    async def ensure(self) -> float:
        """Write a fresh token, retrying with the back-off until it is written; its lifetime in seconds."""
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            try:
                return await self._write()
            except (KubeClientError, OSError, KeyError, TypeError) as exc:
                note = f'MountVolume.SetUp failed for volume "kube-api-access" : {exc}'
                self.event("Warning", "FailedMount", note)
                await self.runtime.sleep(delay)
                delay = min(delay * 2, s.sandbox_backoff_max)

    async def refresh(self, lifetime: float) -> None:
        """Write a new token at ``token_refresh_fraction`` of the last one's lifetime, for ever (until cancelled)."""
        while True:
            await self.runtime.sleep(max(1.0, lifetime * self.runtime.settings.token_refresh_fraction))
            lifetime = await self.ensure()

    async def _write(self) -> float:
        """Write a fresh token; its lifetime in seconds."""
        s, pod = self.runtime.settings, self.pod()
        account = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        answer = await self.runtime.client.create_token(
            self.namespace, account, (), expiration_seconds=s.token_expiration_seconds, bound_pod=pod
        )
        status = answer["status"]
        expires = parse_rfc3339(status.get("expirationTimestamp"))
        now = self.runtime.clock()
        lifetime = expires - now if expires is not None and expires > now else float(s.token_expiration_seconds)
        ca = await self._root_ca()
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # the host side: only the runtime reads a pod's files
        self.service_account_dir.mkdir(mode=0o755, exist_ok=True)
        # 0644, as the kubelet's projected volume: the container may run as any user; only this pod sees them.
        files = {"token": str(status["token"]), "namespace": self.namespace}
        if ca is not None:
            files["ca.crt"] = ca
        for name, text in files.items():
            _write_file(self.service_account_dir / name, text, 0o644)
        self.written = True
        return lifetime

    async def _root_ca(self) -> str | None:
        """The cluster's CA bundle, from the ``kube-root-ca.crt`` ConfigMap of the pod's namespace."""
        try:
            cm = await self.runtime.client.get(kinds.CONFIG_MAPS, ROOT_CA_CONFIG_MAP, self.namespace)
        except KubeNotFoundError:
            return None
        value = (cm.get("data") or {}).get("ca.crt")
        return value if isinstance(value, str) else None


def _write_file(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically (a reader sees the old or the new content, never a part)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def forget_pod_files(directory: Path) -> None:
    """Remove a pod's record and service-account files (its logs stay)."""
    paths = [directory / STATE_FILE, directory / "token", directory / USERNS_FILE]
    sa_dir = directory / "serviceaccount"
    if sa_dir.is_dir():
        paths += list(sa_dir.iterdir())
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        sa_dir.rmdir()
    remove_volumes(directory)
