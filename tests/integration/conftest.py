"""The control-plane rig's fixtures (kube, namespace, plane, plane_options), for every integration module; a
module's own fixture of the same name takes precedence."""

from tests.integration.controlplane_rig import kube, namespace, plane, plane_options  # noqa: F401
