"""Pure domain types of the mesh (DESIGN §4: no asyncio, socket, subprocess or clock imports).

Modules: ``identity`` (:class:`SpiffeId`), ``workload`` (:class:`Workload`, :class:`Service` and their parts, spec
§4.1), ``state`` (:class:`WorkloadState`, the node proxy's index and outbound decision, spec §6.3),
``localconfig`` (the node proxy's local YAML config file) and ``errors`` (the package's error tree).
"""
