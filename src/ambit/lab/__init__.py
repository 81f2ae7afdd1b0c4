"""The lab: a Kubernetes-like cluster on one machine, its nodes and pods network namespaces.

Processes (all started by ``ambit lab up`` and recorded so that ``ambit lab down`` can remove them):

- the embedded API server, in the root namespace, listening on the lab bridge address (``198.18.0.1:6443``);
- the controllers (scheduler, Deployment, EndpointSlice), in the root namespace;
- one node runtime per node (kubelet's role, plus kube-proxy's Service rules), inside the node's namespace;
- the pods' container processes, each inside its pod's namespace.

Addresses and names are in :mod:`ambit.lab.topology`; everything created on the machine is appended to the lab's
record (:mod:`ambit.lab.record`) before it is created, so a crash never leaves something unaccounted for.
"""
