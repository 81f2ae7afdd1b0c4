"""``ambit waypoint``: waypoints, as ``istioctl waypoint`` manages them and as their pods run them.

The group holds the management commands (apply, list, status, delete) and ``proxy``, the command a waypoint
Deployment's pods run (:mod:`ambit.cli.waypoint_proxy`), as Istio's waypoint pods run ``pilot-agent proxy
waypoint``.

The management commands read and write Gateways of class ``istio-waypoint`` through :mod:`ambit.k8s` (the
kubeconfig, as the other commands), with istioctl's flags, messages and columns; the control plane's gateway
deployment controller (:mod:`ambit.controlplane.gateway`) does the rest. Differences from istioctl: ``apply``
creates the Gateway or patches its listener, class and labels (the embedded API server has no server-side apply)
and refuses to turn a Gateway of another class into a waypoint; ``list`` shows the traffic type the control plane
uses (the Gateway's ``istio.io/waypoint-for``, else the GatewayClass's, else ``service``), where istioctl shows
``none`` for a missing label; ``status --wait`` prints each waypoint's row once, when it is ready or the wait
ends, not once per second, then, when the shown waypoints front any, a second table of the Services and
ServiceEntries bound to them with their weighted (canary) waypoints (:mod:`ambit.cli.waypoint_services`).

Flags follow istioctl's: ``-n/--namespace`` and ``--name`` may be given to the group as well as to a command
(cobra's persistent flags; the command's own wins), and boolean flags take ``--flag=false`` and a following
``true``/``false`` word (:mod:`ambit.cli.istioctl_args`).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from ambit.cli.app import app
from ambit.cli.istioctl_args import BoolFlagError, read_bool_flags
from ambit.errors import AmbitError

BOOL_FLAGS = {
    "--enroll-namespace": "--enroll-namespace",
    "--overwrite": "--overwrite",
    "--wait": "--wait",
    "-w": "--wait",
    "--all": "--all",
    "--all-namespaces": "--all-namespaces",
    "-A": "--all-namespaces",
}
"""The boolean flags of the waypoint commands, by spelling: each command declares ``--no-`` forms too."""


class WaypointGroup(TyperGroup):
    """The ``waypoint`` group: reads istioctl's boolean flag spellings before click parses the words."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            words = read_bool_flags(args, BOOL_FLAGS)
        except BoolFlagError as exc:
            ctx.fail(str(exc))  # a usage error: exit status 2, as click's own
        return list(super().parse_args(ctx, words))


waypoint_app = typer.Typer(
    cls=WaypointGroup, help="Waypoints: deploy and inspect them, or run one (proxy).", no_args_is_help=True
)
app.add_typer(waypoint_app, name="waypoint")

WAYPOINT_CLASS = "istio-waypoint"
DEFAULT_NAME = "waypoint"
TRAFFIC_TYPES = ("all", "none", "service", "workload")
WAYPOINT_FOR = "istio.io/waypoint-for"
USE_WAYPOINT = "istio.io/use-waypoint"
REVISION = "istio.io/rev"
DATAPLANE_MODE = "istio.io/dataplane-mode"
POLL = 0.5

Obj = dict[str, Any]
KubeconfigOption = Annotated[
    Path | None, typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config).")
]
NamespaceOption = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace (default: the kubeconfig context's).")
]
AllNamespacesOption = Annotated[
    bool, typer.Option("--all-namespaces/--no-all-namespaces", "-A", help="Waypoints of every namespace.")
]
TimeoutOption = Annotated[
    float, typer.Option("--waypoint-timeout", min=0, help="Seconds to wait for the waypoint to be ready.")
]


class WaypointCommandError(AmbitError):
    """A user-facing failure of a waypoint command: printed as one line, exit status 1."""


@dataclass(frozen=True, slots=True)
class GroupFlags:
    """The flags given to ``ambit waypoint`` itself, before the command: its commands' defaults."""

    namespace: str | None = None
    name: str | None = None


@waypoint_app.callback()
def waypoint_group(
    ctx: typer.Context,
    namespace: NamespaceOption = None,
    name: Annotated[str | None, typer.Option("--name", help="The waypoint's name (apply, status).")] = None,
) -> None:
    """Waypoints: deploy and inspect them, or run one (proxy)."""
    ctx.obj = GroupFlags(namespace=namespace, name=name)


def _group_flags(ctx: typer.Context) -> GroupFlags:
    parent = ctx.parent.obj if ctx.parent is not None else None
    return parent if isinstance(parent, GroupFlags) else GroupFlags()


def _print(text: str) -> None:
    typer.echo(text)


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def _programmed(gateway: Mapping[str, Any]) -> Mapping[str, Any]:
    for condition in (gateway.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Programmed":
            return condition
    return {}


def _is_waypoint(gateway: Mapping[str, Any]) -> bool:
    return (gateway.get("spec") or {}).get("gatewayClassName") == WAYPOINT_CLASS


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def make_gateway(name: str, namespace: str, traffic_type: str | None, revision: str | None) -> Obj:
    """The Gateway ``apply`` writes: one HBONE listener on 15008, the labels the flags ask for."""
    labels: dict[str, str] = {}
    if traffic_type is not None:
        labels[WAYPOINT_FOR] = traffic_type
    if revision:
        labels[REVISION] = revision
    metadata: Obj = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": metadata,
        "spec": {
            "gatewayClassName": WAYPOINT_CLASS,
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _check_traffic_type(command: str, traffic_type: str | None) -> None:
    """istioctl's refusal of a ``--for`` it does not know (exit status 1)."""
    if traffic_type is not None and traffic_type not in TRAFFIC_TYPES:
        typer.echo(
            f"ambit waypoint {command}: invalid traffic type: {traffic_type}. "
            f"Valid options are: [{' '.join(TRAFFIC_TYPES)}]",
            err=True,
        )
        raise typer.Exit(1)


def _check_name(name: str) -> str:
    """The waypoint's name for ``apply``: it names the waypoint's Service too, so a DNS-1035 label."""
    if not name:
        return DEFAULT_NAME
    if name == "none":
        raise WaypointCommandError("invalid name provided for waypoint, 'none' is a reserved value")
    if not _DNS1035_LABEL.fullmatch(name):
        raise WaypointCommandError(
            f"invalid name {name!r} for a waypoint: it must be a DNS-1035 label (at most 63 characters: "
            "lower-case letters, digits and '-', starting with a letter)"
        )
    return name


def _check_namespace(namespace: str) -> str:
    if not _DNS1123_LABEL.fullmatch(namespace):
        raise WaypointCommandError(f"invalid namespace {namespace!r}: it must be a DNS-1123 label")
    return namespace


def _check_object_name(name: str) -> str:
    if not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise WaypointCommandError(f"invalid waypoint name {name!r}: it must be a DNS-1123 subdomain")
    return name


def _run(command: str, work: Callable[[], Any]) -> None:
    """Run ``work`` (a coroutine function); API and user errors become one line on stderr and exit status 1."""
    from ambit.k8s import KubeClientError

    try:
        asyncio.run(work())
    except (WaypointCommandError, KubeClientError) as exc:
        typer.echo(f"ambit waypoint {command}: {exc}", err=True)
        raise typer.Exit(1) from None


def _client(kubeconfig: Path | None) -> Any:
    from ambit.k8s import KubeClient

    return KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()


async def _namespace_labels(client: Any, namespace: str) -> Mapping[str, str]:
    from ambit.k8s import KubeNotFoundError, kinds

    try:
        return _labels(await client.get(kinds.NAMESPACES, namespace))
    except KubeNotFoundError:
        raise WaypointCommandError(f"namespace: {namespace} not found") from None


async def _apply_gateway(client: Any, gateway: Obj) -> None:
    from ambit.k8s import KubeAlreadyExistsError, KubeNotFoundError, kinds

    meta = gateway["metadata"]
    try:
        await client.create(kinds.GATEWAYS, gateway, meta["namespace"])
        return
    except KubeNotFoundError as exc:
        raise WaypointCommandError(
            f"missing Kubernetes Gateway CRDs need to be installed before applying a waypoint: {exc}"
        ) from None
    except KubeAlreadyExistsError:
        pass
    existing = await client.get(kinds.GATEWAYS, meta["name"], meta["namespace"])
    if not _is_waypoint(existing):
        other = (existing.get("spec") or {}).get("gatewayClassName")
        raise WaypointCommandError(
            f"gateway {meta['namespace']}/{meta['name']} exists with class {other!r}, not {WAYPOINT_CLASS!r}; "
            "choose another --name"
        )
    patch: Obj = {"spec": gateway["spec"], "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]}}
    if meta.get("labels"):
        patch["metadata"]["labels"] = meta["labels"]
    await client.patch(kinds.GATEWAYS, meta["name"], patch, meta["namespace"])


async def _wait_programmed(client: Any, namespace: str, name: str, within: float) -> tuple[Obj | None, bool]:
    """Poll the Gateway until Programmed is True or ``within`` seconds pass; the last Gateway read and whether it
    is programmed (a deadline, not ``asyncio.timeout``: the last read is the answer either way)."""
    from ambit.k8s import KubeNotFoundError, kinds

    deadline = time.monotonic() + within
    gateway: Obj | None = None
    while True:
        try:
            gateway = await client.get(kinds.GATEWAYS, name, namespace)
        except KubeNotFoundError:
            gateway = None
        if gateway is not None and _programmed(gateway).get("status") == "True":
            return gateway, True
        if time.monotonic() >= deadline:
            return gateway, False
        await asyncio.sleep(POLL)


@waypoint_app.command("apply")
def apply_command(
    ctx: typer.Context,
    namespace: NamespaceOption = None,
    name: Annotated[str | None, typer.Option("--name", help="The waypoint's name (default: waypoint).")] = None,
    enroll_namespace: Annotated[
        bool,
        typer.Option("--enroll-namespace/--no-enroll-namespace", help="Label the namespace with the waypoint's name."),
    ] = False,
    traffic_type: Annotated[
        str | None, typer.Option("--for", help="The traffic type: all, none, service or workload.")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", "-w", help="Wait for the waypoint to be ready.")] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite/--no-overwrite", help="Overwrite the waypoint the namespace already uses.")
    ] = False,
    revision: Annotated[str | None, typer.Option("--revision", "-r", help="The revision to label it with.")] = None,
    timeout: TimeoutOption = 90.0,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Apply a waypoint (a Gateway of class istio-waypoint) and optionally enroll its namespace."""
    group = _group_flags(ctx)
    namespace = namespace or group.namespace
    name = name if name is not None else group.name
    _check_traffic_type("apply", traffic_type)

    async def work() -> None:
        from ambit.k8s import kinds

        waypoint = _check_name(name or "")
        async with _client(kubeconfig) as client:
            ns = _check_namespace(namespace or client.connection.namespace)
            labels = await _namespace_labels(client, ns)
            if enroll_namespace:
                if labels.get(USE_WAYPOINT) and not overwrite:
                    _print(
                        f"⚠️ Warning: namespace ({ns}) already has an enrolled Waypoint. Consider adding the "
                        "`--overwrite` flag to your apply command."
                    )
                    return
                if labels.get(DATAPLANE_MODE) != "ambient":
                    _print(
                        "⚠️ Warning: namespace is not enrolled in ambient. Consider running\t"
                        f"`kubectl label namespace {ns} istio.io/dataplane-mode=ambient`"
                    )
            await _apply_gateway(client, make_gateway(waypoint, ns, traffic_type, revision))
            _print(f"✅ waypoint {ns}/{waypoint} applied")
            if wait:
                _, ready = await _wait_programmed(client, ns, waypoint, timeout)
                if not ready:
                    raise WaypointCommandError(f"timed out while waiting for waypoint\t{ns}/{waypoint}")
                _print(f"✅ waypoint {ns}/{waypoint} is ready!")
            if enroll_namespace:
                await client.patch(kinds.NAMESPACES, ns, {"metadata": {"labels": {USE_WAYPOINT: waypoint}}})
                _print(f'✅ namespace {ns} labeled with "{USE_WAYPOINT}: {waypoint}"')

    _run("apply", work)


def _current_namespace(kubeconfig: Path | None) -> str:
    """The namespace of the kubeconfig's current context (istioctl's NamespaceOrDefault); ``default`` without one."""
    from ambit.k8s import KubeClientError, connection

    try:
        loaded = connection.load_kubeconfig(kubeconfig) if kubeconfig else connection.load_from_env()
    except KubeClientError:
        return "default"
    return loaded.namespace or "default"


@waypoint_app.command("generate")
def generate_command(
    ctx: typer.Context,
    namespace: NamespaceOption = None,
    name: Annotated[str | None, typer.Option("--name", help="The waypoint's name (default: waypoint).")] = None,
    traffic_type: Annotated[
        str | None, typer.Option("--for", help="The traffic type: all, none, service or workload.")
    ] = None,
    revision: Annotated[str | None, typer.Option("--revision", "-r", help="The revision to label it with.")] = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Print the waypoint ``apply`` would create, as YAML (istioctl waypoint generate); nothing is changed."""
    group = _group_flags(ctx)
    _check_traffic_type("generate", traffic_type)
    try:
        waypoint = _check_name((name if name is not None else group.name) or "")
        ns = _check_namespace(namespace or group.namespace or _current_namespace(kubeconfig))
    except WaypointCommandError as exc:
        typer.echo(f"ambit waypoint generate: {exc}", err=True)
        raise typer.Exit(1) from None
    import yaml

    typer.echo(yaml.safe_dump(make_gateway(waypoint, ns, traffic_type, revision), sort_keys=True), nl=False)


async def _waypoints(client: Any, namespace: str | None) -> list[Obj]:
    """The waypoint Gateways of ``namespace`` (None: all), ordered by namespace then name."""
    from ambit.k8s import kinds

    items, _ = await client.list(kinds.GATEWAYS, namespace)
    found = [g for g in items if _is_waypoint(g)]
    return sorted(found, key=lambda g: (g["metadata"].get("namespace", ""), g["metadata"].get("name", "")))


async def _class_traffic_type(client: Any) -> str:
    from ambit.k8s import KubeClientError, kinds

    try:
        gateway_class = await client.get(kinds.GATEWAY_CLASSES, WAYPOINT_CLASS)
    except KubeClientError:
        return "service"
    return _labels(gateway_class).get(WAYPOINT_FOR) or "service"


@waypoint_app.command("list")
def list_command(
    ctx: typer.Context,
    namespace: NamespaceOption = None,
    all_namespaces: AllNamespacesOption = False,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """List the waypoints: revision, traffic type and whether they are programmed."""
    namespace = namespace or _group_flags(ctx).namespace

    async def work() -> None:
        async with _client(kubeconfig) as client:
            scope = None if all_namespaces else _check_namespace(namespace or client.connection.namespace)
            gateways = await _waypoints(client, scope)
            if not gateways:
                _print("No waypoints found.")
                return
            default_type = await _class_traffic_type(client)
        table = Table(box=None, header_style="bold", pad_edge=False)
        titles = ("NAME", "REVISION", "TRAFFIC TYPE", "PROGRAMMED")
        for title in ("NAMESPACE", *titles) if all_namespaces else titles:
            table.add_column(title)
        for gateway in gateways:
            meta, labels = gateway["metadata"], _labels(gateway)
            cells = [
                meta["name"],
                labels.get(REVISION) or "default",
                labels.get(WAYPOINT_FOR) or default_type,
                str(_programmed(gateway).get("status") or "False"),
            ]
            table.add_row(*([meta.get("namespace", ""), *cells] if all_namespaces else cells))
        _console().print(table)

    _run("list", work)


@waypoint_app.command("status")
def status_command(
    ctx: typer.Context,
    namespace: NamespaceOption = None,
    all_namespaces: AllNamespacesOption = False,
    name: Annotated[str | None, typer.Option("--name", help="Only this waypoint (default: all).")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", "-w", help="Wait for each waypoint to be ready.")] = True,
    timeout: TimeoutOption = 90.0,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Show each waypoint's Programmed condition, waiting for it to be ready (--no-wait: as it is now)."""
    group = _group_flags(ctx)
    namespace = namespace or group.namespace
    name = (name if name is not None else group.name) or None  # an empty name means every waypoint

    async def work() -> None:
        async with _client(kubeconfig) as client:
            scope = None if all_namespaces else _check_namespace(namespace or client.connection.namespace)
            gateways = [g for g in await _waypoints(client, scope) if name is None or g["metadata"]["name"] == name]
            if not gateways:
                _print("No waypoints found.")
                return
            table = Table(box=None, header_style="bold", pad_edge=False)
            titles = ("NAME", "STATUS", "TYPE", "REASON", "MESSAGE")
            for title in ("NAMESPACE", *titles) if all_namespaces else titles:
                table.add_column(title)
            late: str | None = None
            start = time.monotonic()
            for listed in gateways:
                meta, shown = listed["metadata"], listed
                ready = _programmed(listed).get("status") == "True"
                if wait and not ready and late is None:
                    left = max(0.0, timeout - (time.monotonic() - start))
                    latest, ready = await _wait_programmed(client, meta["namespace"], meta["name"], left)
                    shown = latest or listed
                    if not ready:
                        late = f"{meta['namespace']}/{meta['name']}"
                condition = _programmed(shown)
                cells = [
                    meta["name"],
                    str(condition.get("status", "")),
                    str(condition.get("type", "")),
                    str(condition.get("reason", "")),
                    str(condition.get("message", "")),
                ]
                table.add_row(*([meta["namespace"], *cells] if all_namespaces else cells))
            fronted = await _fronted_services(
                client, {f"{g['metadata']['namespace']}/{g['metadata']['name']}" for g in gateways}
            )
        _console().print(table)
        if fronted:
            from ambit.cli.waypoint_services import SERVICE_COLUMNS

            services = Table(box=None, header_style="bold", pad_edge=False)
            for title in SERVICE_COLUMNS:
                services.add_column(title)
            for row in fronted:
                services.add_row(*row)
            _print("")
            _console().print(services)
        if late is not None:
            raise WaypointCommandError(f"timed out while retrieving status for waypoint\t{late}")

    _run("status", work)


async def _fronted_services(client: Any, shown: set[str]) -> list[tuple[str, ...]]:
    """The rows of the Services and ServiceEntries the ``shown`` waypoints front (:mod:`ambit.cli.waypoint_services`),
    read cluster-wide as a binding may cross namespaces; without the ServiceEntry kind, Services only; without
    the right to list Services, a note on stderr and none."""
    from ambit.cli.waypoint_services import service_rows
    from ambit.controlplane.translate import DEFAULT_ROOT_NAMESPACE
    from ambit.controlplane.translate.meshconfig import MESH_CONFIG_MAP
    from ambit.k8s import KubeClientError, kinds

    try:
        gateways, _ = await client.list(kinds.GATEWAYS, None)
        namespaces, _ = await client.list(kinds.NAMESPACES, None)
        services, _ = await client.list(kinds.SERVICES, None)
    except KubeClientError as exc:  # the waypoints' own table stands without it
        typer.echo(f"ambit waypoint status: the services the waypoints front are not shown: {exc}", err=True)
        return []
    try:
        classes, _ = await client.list(kinds.GATEWAY_CLASSES, None)
    except KubeClientError:
        classes = []
    try:
        entries, _ = await client.list(kinds.SERVICE_ENTRIES, None)
    except KubeClientError:
        entries = []
    try:  # the mesh config's serviceEntryVisibility (absent, or not readable: none)
        mesh = [await client.get(kinds.CONFIG_MAPS, MESH_CONFIG_MAP, DEFAULT_ROOT_NAMESPACE)]
    except KubeClientError:
        mesh = []
    return service_rows(
        shown,
        gateways=gateways,
        gateway_classes=classes,
        namespaces=namespaces,
        services=services,
        service_entries=entries,
        mesh_config_maps=mesh,
    )


@waypoint_app.command("delete")
def delete_command(
    ctx: typer.Context,
    names: Annotated[list[str] | None, typer.Argument(help="The waypoints to delete.")] = None,
    namespace: NamespaceOption = None,
    delete_all: Annotated[bool, typer.Option("--all/--no-all", help="Delete all waypoints in the namespace.")] = False,
    revision: Annotated[
        str | None, typer.Option("--revision", "-r", help="Delete the waypoints of this revision.")
    ] = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Delete waypoints by name, all of a namespace (--all), or those of a revision (--revision)."""
    namespace = namespace or _group_flags(ctx).namespace
    if (delete_all or revision) and names:
        typer.echo("ambit waypoint delete: cannot specify waypoint names when deleting all waypoints", err=True)
        raise typer.Exit(1)
    if not (delete_all or revision) and not names:
        typer.echo(
            "ambit waypoint delete: must specify a waypoint name or delete all using --all or delete specific "
            "revision using --revision",
            err=True,
        )
        raise typer.Exit(1)

    async def work() -> None:
        from ambit.k8s import KubeNotFoundError, kinds

        async with _client(kubeconfig) as client:
            ns = _check_namespace(namespace or client.connection.namespace)
            waypoints = await _waypoints(client, ns)
            if names:
                known = {g["metadata"]["name"] for g in waypoints}
                targets = []
                for target in dict.fromkeys(_check_object_name(n) for n in names):
                    if target in known:
                        targets.append(target)
                    else:
                        _print(f"waypoint {ns}/{target} not found")
            else:
                targets = [
                    g["metadata"]["name"] for g in waypoints if revision is None or _labels(g).get(REVISION) == revision
                ]
            for target in targets:
                try:
                    await client.delete(kinds.GATEWAYS, target, ns)
                except KubeNotFoundError:
                    _print(f"waypoint {ns}/{target} not found")
                else:
                    _print(f"waypoint {ns}/{target} deleted")

    _run("delete", work)
