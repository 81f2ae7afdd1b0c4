"""The runtime side of CNI 1.0.0: what containerd or the kubelet do to attach a pod's namespace to a network.

A network configuration list (``*.conflist``, or a single-plugin ``*.conf``/``*.json``; the lexically first file
of the configuration directory wins, as in containerd) names plugins that are executables in the bin directories.
Each invocation gets the ``CNI_*`` environment and the plugin's own configuration on stdin, with ``name``,
``cniVersion`` and ``prevResult`` injected:

- ADD runs the plugins in order; each gets the previous plugin's result as ``prevResult``; the last result is the
  network's result. It is cached (``<cache>/results/<network>-<container>-<ifname>``, libcni's layout and
  ``cniCacheV1`` format) because DEL and CHECK need it.
- DEL runs the plugins in reverse order, each with the cached ADD result as ``prevResult`` (none when there is no
  cache). DEL must succeed when things are already gone: a missing pod namespace is passed as an empty
  ``CNI_NETNS`` (plugins then only release their IPAM state), and every plugin is tried even after one fails, so
  an address is released even when an earlier plugin is broken. The cache is removed once all succeeded.
- CHECK runs the plugins in order with the cached result as ``prevResult`` (skipped when ``disableCheck``).

A plugin fails by exiting non-zero with the CNI error object ``{"cniVersion", "code", "msg", "details"}`` on
stdout; it becomes a :class:`CniInvocationError` (``plugin``, ``command``) carrying that object as an
:class:`ambit.cni.errors.CniError` (``code``, ``msg``, ``details``: the one definition of the format, shared with
Ambit's own plugin). Anything else a plugin does wrong (no error object, an undecodable result) is a
:class:`CniInvocationError` too, never another exception::

    CniInvocationError  a plugin failed, or its output could not be understood (DecodingError, code 6)
    └── CniConfigError  no usable network configuration, or a plugin missing from the bin directories
                        (InvalidConfigError, code 7)

When ``exec_in_netns`` is given, plugins run inside that namespace (``ip netns exec``): in the lab it is the
node's namespace, where the plugins' bridge and host-local state belong. ``CNI_NETNS`` stays the pod's path.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambit.cni.errors import CniError, DecodingError, IncompatibleVersionError, InvalidConfigError
from ambit.commands import CommandRunner
from ambit.errors import AmbitError

CNI_VERSION = "1.0.0"
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
CONF_SUFFIXES = (".conf", ".conflist", ".json")
PLUGIN_TIMEOUT = 60.0

# Well-known error codes (CNI spec, "Error"): 1-99 are reserved, 100+ are the plugin's own.
ERROR_NAMES: Mapping[int, str] = {
    1: "incompatible CNI version",
    2: "unsupported field in network configuration",
    3: "container unknown or does not exist",
    4: "invalid necessary environment variables",
    5: "I/O failure",
    6: "failed to decode content",
    7: "invalid network config",
    11: "try again later",
}

_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")


class CniInvocationError(AmbitError):
    """Running a network's CNI plugins failed: ``error`` is the CNI error the plugin returned, or the one that
    stands for its failure; ``plugin`` is its type, ``command`` ADD, DEL or CHECK."""

    def __init__(self, error: CniError, plugin: str = "", command: str = "") -> None:
        self.error = error
        self.plugin = plugin
        self.command = command
        who = f"CNI plugin {plugin!r}" if plugin else "CNI"
        what = f" {command}" if command else ""
        name = ERROR_NAMES.get(error.code)
        text = f"{who}{what} failed: {error.msg or 'no message'} (code {error.code}{', ' + name if name else ''})"
        super().__init__(text + (f": {error.details}" if error.details else ""))


class CniConfigError(CniInvocationError):
    """No usable network configuration (missing, malformed, or naming a plugin that is not installed)."""

    def __init__(self, msg: str, details: str = "", plugin: str = "") -> None:
        super().__init__(InvalidConfigError(msg, details), plugin)


# -- configuration --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NetworkConfigList:
    name: str
    cni_version: str
    plugins: tuple[Mapping[str, Any], ...]
    disable_check: bool = False
    source: str = ""
    raw: bytes = field(default=b"", repr=False)


def load_conflist(conf_dir: Path) -> NetworkConfigList:
    """The network of ``conf_dir``: its lexically first ``*.conflist``, ``*.conf`` or ``*.json`` file."""
    try:
        files = sorted(p for p in Path(conf_dir).iterdir() if p.suffix in CONF_SUFFIXES and p.is_file())
    except OSError as exc:
        raise CniConfigError(f"cannot read CNI configuration directory {conf_dir}", str(exc)) from None
    if not files:
        raise CniConfigError(f"no CNI configuration in {conf_dir}")
    try:
        data = files[0].read_bytes()
    except OSError as exc:
        raise CniConfigError(f"cannot read {files[0]}", str(exc)) from None
    return parse_conflist(data, str(files[0]), single=files[0].suffix != ".conflist")


def parse_conflist(data: bytes, source: str = "", *, single: bool = False) -> NetworkConfigList:
    """A configuration list, or with ``single`` a one-plugin ``.conf`` turned into a list as libcni does."""
    where = source or "CNI configuration"
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CniConfigError(f"{where} is not JSON", str(exc)) from None
    if not isinstance(obj, dict):
        raise CniConfigError(f"{where}: expected a JSON object")
    name, version = obj.get("name"), obj.get("cniVersion")
    if not isinstance(name, str) or not name:
        raise CniConfigError(f"{where}: 'name' must be a non-empty string")
    if version not in SUPPORTED_VERSIONS:
        raise CniConfigError(f"{where}: cniVersion {version!r} is not one of {', '.join(SUPPORTED_VERSIONS)}")
    plugins = [obj] if single else obj.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise CniConfigError(f"{where}: 'plugins' must be a non-empty list")
    for plugin in plugins:
        if not isinstance(plugin, dict) or not _plugin_name_ok(plugin.get("type")):
            raise CniConfigError(f"{where}: every plugin needs a 'type' that is a plain file name")
    disable = obj.get("disableCheck") is True or obj.get("disableCheck") == "true"
    return NetworkConfigList(name, str(version), tuple(plugins), disable, source, bytes(data))


def _plugin_name_ok(kind: object) -> bool:
    return isinstance(kind, str) and kind not in ("", ".", "..") and "/" not in kind and "\0" not in kind


def find_plugin(kind: str, bin_dirs: Sequence[Path | str]) -> Path:
    """The executable for plugin type ``kind``: the first bin directory that has it."""
    for directory in bin_dirs:
        path = Path(directory) / kind
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise CniConfigError(f"failed to find plugin {kind!r} in path {[str(d) for d in bin_dirs]}", plugin=kind)


# -- invocation (pure parts) ----------------------------------------------------------------------------------


def cni_args_string(cni_args: Mapping[str, str]) -> str:
    """``CNI_ARGS``: ``IgnoreUnknown=1`` first (so plugins accept the Kubernetes keys), then ``K=V`` pairs."""
    pairs = {"IgnoreUnknown": "1", **cni_args}
    for key, value in pairs.items():
        if not key or any(c in key for c in ";=") or ";" in value:
            raise ValueError(f"CNI_ARGS cannot carry {key!r}={value!r}")
    return ";".join(f"{key}={value}" for key, value in pairs.items())


def plugin_env(
    command: str,
    container_id: str,
    netns_path: str,
    ifname: str,
    cni_args: Mapping[str, str],
    bin_dirs: Sequence[Path | str],
) -> dict[str, str]:
    """The ``CNI_*`` variables of one invocation."""
    if not _CONTAINER_ID.match(container_id):
        raise ValueError(f"invalid container id {container_id!r}")
    if not ifname or len(ifname) > 15 or ifname in (".", "..") or any(c in ifname for c in "/:") or " " in ifname:
        raise ValueError(f"invalid interface name {ifname!r}")
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns_path,
        "CNI_IFNAME": ifname,
        "CNI_ARGS": cni_args_string(cni_args),
        "CNI_PATH": os.pathsep.join(str(d) for d in bin_dirs),
    }


def plugin_stdin(
    conflist: NetworkConfigList, plugin: Mapping[str, Any], prev_result: Mapping[str, Any] | None
) -> bytes:
    """The plugin's configuration with the network's ``name`` and ``cniVersion`` and the ``prevResult``."""
    conf = {**plugin, "name": conflist.name, "cniVersion": conflist.cni_version}
    conf.pop("prevResult", None)
    if prev_result is not None:
        conf["prevResult"] = prev_result
    return json.dumps(conf).encode()


# -- results and errors ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CniInterface:
    name: str
    mac: str = ""
    sandbox: str = ""  # the namespace path for interfaces inside the pod, "" for the host's


@dataclass(frozen=True, slots=True)
class CniIp:
    address: str  # CIDR, e.g. 198.18.1.2/24
    gateway: str | None = None
    interface: int | None = None  # index into CniResult.interfaces

    @property
    def ip(self) -> str:
        return str(ipaddress.ip_interface(self.address).ip)


@dataclass(frozen=True, slots=True)
class CniRoute:
    dst: str
    gw: str | None = None


@dataclass(frozen=True, slots=True)
class CniDns:
    nameservers: tuple[str, ...] = ()
    domain: str = ""
    search: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CniResult:
    cni_version: str
    interfaces: tuple[CniInterface, ...] = ()
    ips: tuple[CniIp, ...] = ()
    routes: tuple[CniRoute, ...] = ()
    dns: CniDns = CniDns()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def pod_ips(self) -> tuple[str, ...]:
        """The addresses on interfaces inside the sandbox (all addresses when the result does not say where)."""
        inside = [
            ip.ip
            for ip in self.ips
            if ip.interface is not None
            and ip.interface < len(self.interfaces)
            and self.interfaces[ip.interface].sandbox
        ]
        return tuple(inside) if inside else tuple(ip.ip for ip in self.ips)


class _Malformed(Exception):
    pass


def parse_result(data: bytes, plugin: str = "", command: str = "ADD") -> CniResult:
    """A plugin's result; anything that is not a well-formed result raises :class:`CniInvocationError` (code 6)."""
    try:
        obj = json.loads(data)
        return _result(obj)
    except (ValueError, RecursionError, _Malformed) as exc:
        text = data[:200].decode(errors="replace")
        raise CniInvocationError(DecodingError(f"undecodable result ({exc})", text), plugin, command) from None


def _result(obj: object) -> CniResult:
    if not isinstance(obj, dict):
        raise _Malformed("not a JSON object")
    interfaces = tuple(
        CniInterface(_str(i, "name", required=True) or "", _str(i, "mac") or "", _str(i, "sandbox") or "")
        for i in _objects(obj, "interfaces")
    )
    ips = tuple(
        CniIp(_cidr(ip, "address"), _ip(ip, "gateway"), _index(ip, "interface", len(interfaces)))
        for ip in _objects(obj, "ips")
    )
    routes = tuple(CniRoute(_cidr(r, "dst"), _ip(r, "gw")) for r in _objects(obj, "routes"))
    dns_obj = obj.get("dns")
    if dns_obj is None:
        dns_obj = {}
    if not isinstance(dns_obj, dict):
        raise _Malformed("'dns' is not an object")
    dns = CniDns(
        _strings(dns_obj, "nameservers"), _str(dns_obj, "domain") or "", _strings(dns_obj, "search"),
        _strings(dns_obj, "options"),
    )  # fmt: skip
    return CniResult(_str(obj, "cniVersion") or "", interfaces, ips, routes, dns, obj)


def _objects(obj: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = obj.get(key, [])
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _Malformed(f"{key!r} is not a list of objects")
    return items


def _str(obj: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _Malformed(f"{key!r} is not a string")
    return value


def _strings(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Malformed(f"{key!r} is not a list of strings")
    return tuple(value)


def _cidr(obj: Mapping[str, Any], key: str) -> str:
    value = _str(obj, key, required=True) or ""
    if "/" not in value:
        raise _Malformed(f"{key!r} {value!r} is not an address with a prefix length")
    return str(ipaddress.ip_interface(value))  # ValueError when malformed


def _ip(obj: Mapping[str, Any], key: str) -> str | None:
    value = _str(obj, key)
    return None if value is None else str(ipaddress.ip_address(value))


def _index(obj: Mapping[str, Any], key: str, limit: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
        raise _Malformed(f"{key!r} {value!r} is not an index into 'interfaces'")
    return value


def parse_error(
    returncode: int, stdout: bytes, stderr: bytes, plugin: str = "", command: str = ""
) -> CniInvocationError:
    """The :class:`CniInvocationError` for a failed invocation: the plugin's error object, else what it printed."""
    try:
        obj = json.loads(stdout)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("msg"), str):
        code = obj.get("code")
        details = obj.get("details")
        error = CniError(
            obj["msg"],
            details if isinstance(details, str) else "",
            code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
        )
        return CniInvocationError(error, plugin, command)
    output = (stdout.decode(errors="replace").strip() or stderr.decode(errors="replace").strip())[-1000:]
    return CniInvocationError(CniError(f"exited {returncode} without an error object", output, code=0), plugin, command)


# -- invocation -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    container_id: str
    netns_path: str
    ifname: str
    cni_args: Mapping[str, str]
    bin_dirs: Sequence[Path | str]
    runner: CommandRunner
    exec_in_netns: str | None
    timeout: float


async def _invoke(
    command: str, conflist: NetworkConfigList, plugin: Mapping[str, Any], prev: Mapping[str, Any] | None, call: _Call
) -> bytes:
    kind = str(plugin["type"])
    path = find_plugin(kind, call.bin_dirs)
    env = plugin_env(command, call.container_id, call.netns_path, call.ifname, call.cni_args, call.bin_dirs)
    argv = [str(path)] if call.exec_in_netns is None else ["ip", "netns", "exec", call.exec_in_netns, str(path)]
    stdin = plugin_stdin(conflist, plugin, prev)
    try:
        async with asyncio.timeout(call.timeout):
            out = await call.runner.run_async(argv, stdin=stdin, env=env, check=False)
    except TimeoutError:
        error = CniError(f"no answer within {call.timeout:g} s", code=0)
        raise CniInvocationError(error, plugin=kind, command=command) from None
    if not out.ok:
        raise parse_error(out.returncode, out.stdout, out.stderr, kind, command)
    return out.stdout


async def add(
    conflist: NetworkConfigList,
    container_id: str,
    netns_path: str,
    ifname: str,
    cni_args: Mapping[str, str],
    bin_dirs: Sequence[Path | str],
    runner: CommandRunner,
    exec_in_netns: str | None = None,
    *,
    cache_dir: Path | None = None,
    plugin_timeout: float = PLUGIN_TIMEOUT,
) -> CniResult:
    """ADD: attach the namespace at ``netns_path`` to the network; the last plugin's result."""
    call = _Call(container_id, netns_path, ifname, cni_args, bin_dirs, runner, exec_in_netns, plugin_timeout)
    result: CniResult | None = None
    for plugin in conflist.plugins:
        out = await _invoke("ADD", conflist, plugin, result.raw if result else None, call)
        result = parse_result(out, str(plugin["type"]), "ADD")
    assert result is not None  # parse_conflist guarantees at least one plugin
    if cache_dir is not None:
        _write_cache(cache_dir, conflist, call, result)
    return result


async def delete(
    conflist: NetworkConfigList,
    container_id: str,
    netns_path: str,
    ifname: str,
    cni_args: Mapping[str, str],
    bin_dirs: Sequence[Path | str],
    runner: CommandRunner,
    exec_in_netns: str | None = None,
    *,
    cache_dir: Path | None = None,
    plugin_timeout: float = PLUGIN_TIMEOUT,
) -> None:
    """DEL: detach, tolerating what is already gone; every plugin is tried, the first failure is raised."""
    if netns_path and not _exists(netns_path):
        netns_path = ""  # the namespace is gone: plugins release what they hold outside it
    call = _Call(container_id, netns_path, ifname, cni_args, bin_dirs, runner, exec_in_netns, plugin_timeout)
    cached = _read_cache(cache_dir, conflist.name, container_id, ifname) if cache_dir is not None else None
    first: CniInvocationError | None = None
    for plugin in reversed(conflist.plugins):
        try:
            await _invoke("DEL", conflist, plugin, cached, call)
        except CniInvocationError as exc:
            first = first or exc
    if first is not None:
        raise first
    if cache_dir is not None:
        _cache_path(cache_dir, conflist.name, container_id, ifname).unlink(missing_ok=True)


async def check(
    conflist: NetworkConfigList,
    container_id: str,
    netns_path: str,
    ifname: str,
    cni_args: Mapping[str, str],
    bin_dirs: Sequence[Path | str],
    runner: CommandRunner,
    exec_in_netns: str | None = None,
    *,
    cache_dir: Path | None = None,
    plugin_timeout: float = PLUGIN_TIMEOUT,
) -> None:
    """CHECK: ask every plugin whether the attachment is still as ADD left it; raises :class:`CniInvocationError`
    if not."""
    if conflist.disable_check:
        return
    if conflist.cni_version in ("0.3.0", "0.3.1"):
        too_old = IncompatibleVersionError(f"CHECK needs cniVersion 0.4.0 or later, not {conflist.cni_version}")
        raise CniInvocationError(too_old, command="CHECK")
    cached = _read_cache(cache_dir, conflist.name, container_id, ifname) if cache_dir is not None else None
    if cached is None:
        error = CniError(f"no cached ADD result for container {container_id!r} on {conflist.name!r}", code=3)
        raise CniInvocationError(error, command="CHECK")
    call = _Call(container_id, netns_path, ifname, cni_args, bin_dirs, runner, exec_in_netns, plugin_timeout)
    for plugin in conflist.plugins:
        await _invoke("CHECK", conflist, plugin, cached, call)


def _exists(path: str) -> bool:
    return os.path.exists(path)  # a stat in /run (tmpfs): no need to leave the event loop


# -- the result cache (libcni's layout) -----------------------------------------------------------------------


def _cache_path(cache_dir: Path, network: str, container_id: str, ifname: str) -> Path:
    return Path(cache_dir) / "results" / f"{network}-{container_id}-{ifname}"


def _write_cache(cache_dir: Path, conflist: NetworkConfigList, call: _Call, result: CniResult) -> None:
    path = _cache_path(cache_dir, conflist.name, call.container_id, call.ifname)
    entry = {
        "kind": "cniCacheV1",
        "containerId": call.container_id,
        "config": base64.b64encode(conflist.raw).decode(),
        "ifName": call.ifname,
        "networkName": conflist.name,
        "netns": call.netns_path,
        "cniArgs": [[key, value] for key, value in call.cni_args.items()],
        "result": dict(result.raw),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, path)


def _read_cache(cache_dir: Path, network: str, container_id: str, ifname: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(_cache_path(cache_dir, network, container_id, ifname).read_bytes())
    except (OSError, ValueError):
        return None
    result = entry.get("result") if isinstance(entry, dict) else None
    return result if isinstance(result, dict) else None
