"""Cluster DNS for the lab (kube-dns's role): records from Services and EndpointSlices, answered over UDP and TCP.

:mod:`records` turns API objects into an immutable index, :mod:`answer` answers one query from it (pure, dnspython's
message API), :mod:`resolv` renders a pod's ``/etc/resolv.conf`` as the kubelet does, and :mod:`server` is the
asyncio shell that watches the API and serves port 53.
"""
