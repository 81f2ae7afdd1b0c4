"""The control plane: what istiod does for ambient, from Kubernetes objects to the node proxies' configuration.

Subpackages: ``translate`` (pure: Pods, Services, EndpointSlices and Namespaces in, the Workload API's workloads
and services out, spec §4.1), served to the node proxies over xDS (spec §4.2).
"""
