"""In-pod mode of the node proxy (spec §1.3): listeners created inside each pod's network namespace.

Modules: ``listeners`` (open the sockets in a netns, given its fd, on a helper thread that ``setns``-es) and
``workloads`` (``PodListenerManager``: per pod uid, serve those sockets; the ZDS client's pod handler).
"""
