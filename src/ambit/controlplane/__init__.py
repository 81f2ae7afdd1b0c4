"""The control plane: what istiod does for ambient, from Kubernetes objects to the node proxies' configuration.

Subpackages: ``translate`` (pure: Pods, Services, EndpointSlices and Namespaces in, the Workload API's workloads
and services out, spec §4.1). Serving the result over xDS (spec §4.2) comes later; until then the lab writes it to
a local file (:mod:`ambit.lab.mesh.config`) that each node proxy reads.
"""
