"""``ambit apiserver``: the embedded Kubernetes-compatible API server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer

from ambit.cli.app import app


@app.command()
def apiserver(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="State directory (state.db, PKI, kubeconfig).")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve HTTPS on.")] = "127.0.0.1:6443",
    kubeconfig: Annotated[Path | None, typer.Option(help="Where to write the admin kubeconfig.")] = None,
    san: Annotated[list[str] | None, typer.Option(help="Extra DNS name or IP for the serving certificate.")] = None,
    service_cidr: Annotated[
        str,
        typer.Option(
            help="Range Service cluster IPs come from; two ranges of different families, comma-separated, make a "
            "dual-stack cluster (the first is the primary), as kube-apiserver's --service-cluster-ip-range."
        ),
    ] = "198.19.0.0/16",
    api_audience: Annotated[
        list[str] | None,
        typer.Option(help="An audience tokens must carry to be accepted (repeatable); default: the issuer."),
    ] = None,
    advertise_address: Annotated[
        str, typer.Option(help="Address pods reach this server at (default/kubernetes); default: the listen host.")
    ] = "",
    crds: Annotated[Path | None, typer.Option(help="Directory of CRDs to install at start.")] = None,
    token_auth_file: Annotated[
        Path | None, typer.Option(help='Static tokens, kube\'s CSV: token,user,uid,"group,..." (mode 0600).')
    ] = None,
    user_qps: Annotated[float, typer.Option(help="Sustained requests per second per user (admins exempt).")] = 100.0,
    user_burst: Annotated[int, typer.Option(help="Requests per user at once after a pause.")] = 200,
    max_watches_per_user: Annotated[int, typer.Option(help="Open watches per user (admins exempt).")] = 100,
    max_pod_streams_per_user: Annotated[
        int, typer.Option(help="Open pods/log and pods/exec streams per user (admins exempt).")
    ] = 32,
    runtime_config: Annotated[
        list[str] | None,
        typer.Option(help="GROUP/VERSION=false turns a built-in API off, as kube-apiserver's flag (repeatable)."),
    ] = None,
    watch_send_timeout: Annotated[
        float, typer.Option(help="Seconds a watch may stall on a client that does not read before it is closed.")
    ] = 10.0,
    kubelet_socket_dir: Annotated[
        Path | None,
        typer.Option(help="Directory of nodes' kubelet sockets (DIR/<node>/kubelet.sock) for pods/log and pods/exec."),
    ] = None,
) -> None:
    """Serve the Kubernetes REST API over HTTPS, persisted in SQLite, usable by kubectl."""
    from ambit.apiserver.limits import LimitSettings
    from ambit.apiserver.registry import RuntimeConfigError
    from ambit.apiserver.registry import runtime_config as parse_runtime_config
    from ambit.apiserver.server import DEFAULT_CRD_DIR, ApiServerSettings, serve_forever
    from ambit.errors import AmbitError

    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    from ambit.apiserver.service_ips import service_ranges

    try:
        service_ranges(service_cidr)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--service-cidr") from None
    try:
        turned_off = parse_runtime_config(runtime_config or ())
    except RuntimeConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--runtime-config") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiServerSettings(
        data_dir=data_dir,
        host=host.strip("[]") or "127.0.0.1",
        port=int(port_text),
        kubeconfig=kubeconfig,
        extra_sans=tuple(san or ()),
        crd_dir=crds or DEFAULT_CRD_DIR,
        service_cidr=service_cidr,
        advertise_address=advertise_address,
        api_audiences=tuple(api_audience or ()),
        token_auth_file=token_auth_file,
        runtime_config=turned_off,
        kubelet_socket_dir=kubelet_socket_dir,
        limits=LimitSettings(
            requests_per_second=user_qps,
            burst=user_burst,
            max_watches_per_user=max_watches_per_user,
            max_pod_streams_per_user=max_pod_streams_per_user,
            watch_send_timeout=watch_send_timeout,
        ),
    )
    try:
        asyncio.run(serve_forever(settings))
    except AmbitError as exc:
        typer.echo(f"ambit apiserver: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"ambit apiserver: cannot serve on {listen}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None
