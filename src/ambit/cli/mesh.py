"""``ambit nodeagent`` and ``ambit nodeproxy``: the mesh's per-node processes, as ``ambit lab up --mesh`` runs them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from ambit.cli.main import app
from ambit.lab.topology import DEFAULT_DIR, Topology

NodeOption = Annotated[str, typer.Option("--node", help="The node's name.")]
LabDirOption = Annotated[Path, typer.Option("--lab-dir", help="The lab's directory.")]


def _lab_node(directory: Path, node: str) -> Topology:
    topology = Topology.load(directory.resolve())
    if topology is None:
        typer.echo(f"ambit: no lab in {directory}", err=True)
        raise typer.Exit(1)
    if topology.node_named(node) is None:
        raise typer.BadParameter(f"no node {node!r} in this lab")
    return topology


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command(hidden=True)
def nodeagent(
    node: NodeOption,
    directory: LabDirOption = DEFAULT_DIR,
    uninstall: Annotated[bool, typer.Option(help="Remove the CNI plugin on exit.")] = False,
) -> None:
    """Run a lab node's agent: the ambit-cni plugin, ZDS and pod enrolment (started by `ambit lab up --mesh`)."""
    from ambit.cni.daemon import run_node_agent

    topology = _lab_node(directory, node)

    def netns_for(pod: dict[str, Any]) -> str | None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        path = Path(f"/run/netns/{topology.pod_netns(uid)}")
        return str(path) if uid and path.exists() else None

    _logging()
    asyncio.run(
        run_node_agent(
            topology.kubeconfig,
            node,
            cni_conf_dir=topology.cni_conf_dir(node),
            cni_bin_dir=topology.cni_bin_dir(node),
            run_dir=topology.node_dir(node) / "run",
            netns_for=netns_for,
            uninstall=uninstall,
        )
    )


@app.command(hidden=True)
def nodeproxy(
    node: NodeOption,
    directory: LabDirOption = DEFAULT_DIR,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="Workloads and services from this YAML file [default: <lab>/mesh/workloads.yaml]."
        ),
    ] = None,
    local_ca: Annotated[
        Path | None,
        typer.Option(
            "--local-ca", help="Sign workload certificates with the CA in this directory [default: <lab>/mesh/ca]."
        ),
    ] = None,
    trust_domain: Annotated[str, typer.Option("--trust-domain", help="The mesh's trust domain.")] = "cluster.local",
) -> None:
    """Run a lab node's proxy: in-pod listeners for the pods the node agent hands over (ZDS)."""
    from ambit.cni.daemon import ZDS_SOCKET
    from ambit.inpod.daemon import run_node_proxy
    from ambit.inpod.settings import NodeProxySettings
    from ambit.model.identity import IdentityError, check_trust_domain

    try:
        check_trust_domain(trust_domain)
    except IdentityError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trust-domain") from None
    topology = _lab_node(directory, node)
    settings = NodeProxySettings(
        node=node,
        zds_socket=topology.node_dir(node) / "run" / ZDS_SOCKET,
        config_file=config or topology.mesh_config_file,
        local_ca_dir=local_ca or topology.mesh_ca_dir,
        trust_domain=trust_domain,
    )
    _logging()
    asyncio.run(run_node_proxy(settings))
