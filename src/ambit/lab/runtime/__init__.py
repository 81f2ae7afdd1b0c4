"""The node runtime: the kubelet's role for one lab node.

:mod:`.kubelet` registers the node and gives each pod a worker (:mod:`.pod_worker`); pods are network namespaces
(:mod:`.sandbox`), containers are processes (:mod:`.processes`) run by a pure state machine (:mod:`.containers`)
and its asyncio shell (:mod:`.containers_apply`), with probes (:mod:`.probes`), environment (:mod:`.pod_env`),
restart back-off (:mod:`.backoff`), the record that lets a restarted runtime adopt its pods (:mod:`.pod_record`),
and the status reported for pods and the node (:mod:`.pod_status`, :mod:`.node_status`).

Pure and shell pairs are named ``x`` (pure) and ``x_apply`` (the I/O that carries it out), as in
:mod:`ambit.lab.network.services` and :mod:`ambit.lab.network.services_apply`.
"""
