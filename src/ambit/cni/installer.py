"""Install the ``ambit-cni`` plugin on a node: chain it into the primary CNI configuration, place the executable.

Theory of operation (spec §1.2, "Installer"). The runtime uses the lexically first ``*.conf``/``*.conflist``/
``*.json`` file in the CNI configuration directory, as libcni's ``ConfFiles`` does, so that is the file we edit:

- :func:`insert_plugin` (pure) appends our entry as the last plugin of the list, replacing any earlier entry of
  type ``ambit-cni`` and keeping the other plugins in order. A single-plugin ``.conf`` becomes a ``.conflist``
  ``{"cniVersion", "name", "plugins": [original, ours]}``; the caller deletes the old file.
- :func:`remove_plugin` (pure) drops our entries and leaves a conflist in place (we cannot know whether it was
  converted, and a one-plugin conflist is valid).
- JSON is rendered with two-space indentation and the input's key order, so a second insert of the same entry
  produces byte-identical text: that is what lets the watcher tell "already installed" from "changed".

The plugin executable is *copied* (not symlinked) into the CNI binary directory as ``ambit-cni``: on a real node
the binary directory is the host's ``/opt/cni/bin`` mounted into the agent's container, where a symlink to a path
inside the container would dangle. What is copied is the caller's choice: the ``ambit-cni`` console script (its
shebang names the virtualenv's interpreter) or a wrapper from :func:`render_wrapper`
(``#!/bin/sh`` + ``exec <python> -I -m ambit.cni.plugin "$@"``), which works without the console script.

Files are written atomically (temporary file in the same directory, then ``os.replace``). :class:`InstallWatcher`
polls a cheap stat signature of both directories and re-runs the install when anything changed, so an edit by
the primary CNI (or an admin) that drops our entry is repaired within one interval. Only cancellation ends the
watcher: a poll that fails (a directory unreadable or replaced by a file for a while) is logged and the next poll
comes as usual, so the plugin is repaired once the directory is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.cni.errors import CniError
from ambit.cni.plugin import PLUGIN_TYPE
from ambit.supervision import poll_every

log = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".conf", ".conflist", ".json")
BINARY_NAME = PLUGIN_TYPE


class InstallError(CniError):
    """The node's CNI configuration cannot be edited (missing, unreadable or not a CNI config)."""


@dataclass(frozen=True, slots=True)
class InstallResult:
    config: Path
    """The configuration file that now chains our plugin."""
    binary: Path
    """The installed executable."""
    removed: Path | None = None
    """The ``.conf`` file replaced by its ``.conflist`` conversion, if any."""
    changed: bool = True
    """False when everything was already in place (nothing written)."""


def render_config(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def _load(conf_text: str, filename: str) -> dict[str, Any]:
    try:
        doc = json.loads(conf_text)
    except ValueError as e:
        raise InstallError(f"{filename}: not valid JSON", str(e)) from e
    if not isinstance(doc, dict):
        raise InstallError(f"{filename}: not a JSON object")
    if "plugins" in doc and not (isinstance(doc["plugins"], list) and all(isinstance(p, dict) for p in doc["plugins"])):
        raise InstallError(f"{filename}: plugins must be a list of objects")
    return doc


def insert_plugin(conf_text: str, filename: str, plugin_entry: dict[str, Any]) -> tuple[str, str]:
    """Return (new text, new filename) with ``plugin_entry`` chained last; idempotent."""
    if plugin_entry.get("type") != PLUGIN_TYPE:
        raise ValueError(f"plugin entry must have type {PLUGIN_TYPE!r}")
    doc = _load(conf_text, filename)
    if "plugins" not in doc:
        doc = {"cniVersion": doc.get("cniVersion"), "name": doc.get("name"), "plugins": [doc]}
        stem, dot, _ = filename.rpartition(".")
        filename = f"{stem if dot else filename}.conflist"
    kept = [p for p in doc["plugins"] if p.get("type") != PLUGIN_TYPE]
    doc["plugins"] = [*kept, dict(plugin_entry)]
    return render_config(doc), filename


def remove_plugin(conf_text: str, filename: str) -> tuple[str, str]:
    """Return (new text, filename) without any ``ambit-cni`` entry; a file without plugins list is unchanged."""
    doc = _load(conf_text, filename)
    if "plugins" not in doc:
        return conf_text, filename
    doc["plugins"] = [p for p in doc["plugins"] if p.get("type") != PLUGIN_TYPE]
    return render_config(doc), filename


def render_wrapper(python: Path) -> str:
    """A shell wrapper that runs the plugin module with ``python`` (isolated mode: no PYTHON* env, no cwd)."""
    return f'#!/bin/sh\nexec {shlex.quote(str(python))} -I -m ambit.cni.plugin "$@"\n'


def find_primary_config(conf_dir: Path) -> Path | None:
    """The file the runtime would use: lexically first by name among the CNI config suffixes."""
    try:
        names = sorted(p.name for p in conf_dir.iterdir() if p.suffix in CONFIG_SUFFIXES and p.is_file())
    except FileNotFoundError:
        return None
    return conf_dir / names[0] if names else None


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, token: str) -> None:
    """Write the plugin's kubeconfig as JSON (valid YAML too), mode 0600."""
    import base64

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": "ambit-cni", "user": {"token": token}}],
        "contexts": [{"name": "ambit-cni", "context": {"cluster": "local", "user": "ambit-cni"}}],
        "current-context": "ambit-cni",
    }
    write_atomic(path, render_config(doc).encode(), 0o600)


def install(conf_dir: Path, bin_dir: Path, plugin_entry: dict[str, Any], plugin_executable: Path) -> InstallResult:
    """Chain our entry into the primary config and copy the executable; writes only what differs."""
    binary = bin_dir / BINARY_NAME
    wanted = plugin_executable.read_bytes()
    changed = False
    if not binary.is_file() or binary.read_bytes() != wanted or not os.access(binary, os.X_OK):
        bin_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(binary, wanted, 0o755)
        changed = True
    primary = find_primary_config(conf_dir)
    if primary is None:
        raise InstallError(f"{conf_dir}: no CNI configuration (*.conf, *.conflist) to chain into")
    text = primary.read_text(encoding="utf-8")
    new_text, new_name = insert_plugin(text, primary.name, plugin_entry)
    target = conf_dir / new_name
    removed = None
    if new_text != text or target != primary:
        write_atomic(target, new_text.encode())
        changed = True
        if target != primary:
            primary.unlink(missing_ok=True)
            removed = primary
    return InstallResult(config=target, binary=binary, removed=removed, changed=changed)


def uninstall(conf_dir: Path, bin_dir: Path) -> list[Path]:
    """Remove our entry from every CNI config in ``conf_dir`` and the executable; returns the files changed."""
    changed: list[Path] = []
    for path in sorted(conf_dir.iterdir()) if conf_dir.is_dir() else []:
        if path.suffix not in CONFIG_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        try:
            new_text, _ = remove_plugin(text, path.name)
        except InstallError:
            continue  # not ours to judge; leave foreign files alone
        if new_text != text:
            write_atomic(path, new_text.encode())
            changed.append(path)
    binary = bin_dir / BINARY_NAME
    if binary.exists() or binary.is_symlink():
        binary.unlink()
        changed.append(binary)
    return changed


def _signature(conf_dir: Path, bin_dir: Path) -> tuple[object, ...]:
    """What the watcher compares between polls: names, sizes, mtimes and inodes of the files we care about."""
    entries: list[object] = []
    for directory, names in ((conf_dir, None), (bin_dir, {BINARY_NAME})):
        try:
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if (names is None and entry.name.endswith(CONFIG_SUFFIXES)) or (names and entry.name in names):
                    st = entry.stat(follow_symlinks=False)
                    entries.append((directory, entry.name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode))
        except FileNotFoundError:
            entries.append((directory, None))
    return tuple(entries)


class InstallWatcher:
    """Keep the plugin installed: install now, then re-check whenever the directories' signature changes."""

    def __init__(
        self,
        conf_dir: Path,
        bin_dir: Path,
        plugin_entry: dict[str, Any],
        plugin_executable: Path,
        *,
        interval: float = 0.5,
    ) -> None:
        self.conf_dir = conf_dir
        self.bin_dir = bin_dir
        self.plugin_entry = plugin_entry
        self.plugin_executable = plugin_executable
        self.interval = interval
        self.repairs = 0
        """How many times an install wrote something after the first one (for tests and metrics)."""
        self._seen: tuple[object, ...] | None = None
        self._installed_once = False
        self._task: asyncio.Task[None] | None = None

    def check(self) -> InstallResult | None:
        """One poll: if anything changed since the last look, (re)install. Returns the result if it ran."""
        signature = _signature(self.conf_dir, self.bin_dir)
        if signature == self._seen:
            return None
        try:
            result = install(self.conf_dir, self.bin_dir, self.plugin_entry, self.plugin_executable)
        except (InstallError, OSError) as e:
            log.warning("cni install failed, retrying: %s", e)
            self._seen = None
            return None
        if result.changed and self._installed_once:
            self.repairs += 1
            log.info("cni install repaired %s", result.config)
        self._installed_once = True
        self._seen = _signature(self.conf_dir, self.bin_dir)
        return result

    async def run(self) -> None:
        """Check every ``interval`` seconds until cancelled; a failed check (an unreadable directory) is logged and
        the next one comes as usual (:func:`ambit.supervision.poll_every`)."""
        await poll_every(self.interval, self.check, f"the CNI install watcher of {self.conf_dir}")

    async def __aenter__(self) -> InstallWatcher:
        self.check()
        self._task = asyncio.create_task(self.run(), name=f"cni install watcher {self.conf_dir}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
