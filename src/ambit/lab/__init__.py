"""The lab: a Kubernetes-like cluster on one machine, its nodes and pods network namespaces.

Processes (all started by ``ambit lab up`` and recorded so that ``ambit lab down`` can remove them):

- the embedded API server, in the root namespace, listening on the lab bridge address (``198.18.0.1:6443``);
- the controllers (scheduler, Deployment, EndpointSlice), in the root namespace;
- one node runtime per node (kubelet's role, plus kube-proxy's Service rules), inside the node's namespace;
- the pods' container processes, each inside its pod's namespace.

Subpackages, by domain:

- :mod:`~ambit.lab.cluster`: bringing the lab up and down, its crash-safe record, the long-running node and
  controllers processes, and restarting the installed mesh's components;
- :mod:`~ambit.lab.network`: addresses and names (:mod:`~ambit.lab.network.topology`), the bridge and node
  namespaces, the runtime side of CNI (invoking plugins), and the Service rules;
- :mod:`~ambit.lab.runtime`: the node runtime (the kubelet's role): pod workers, sandboxes, containers, probes,
  processes and the status they report;
- :mod:`~ambit.lab.mesh`: the mesh's config file and the node proxies' credentials;
- :mod:`~ambit.lab.controllers`: the cluster's controllers;
- :mod:`ambit.lab.apps`: example workloads (``python3 -m ambit.lab.apps``).

Everything created on the machine is appended to the lab's record (:mod:`ambit.lab.cluster.record`) before it is
created, so a crash never leaves something unaccounted for.
"""
