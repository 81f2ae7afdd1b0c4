"""Workload identity for the node proxy: one SPIFFE certificate per service account with pods on the node.

:mod:`~ambit.identity.manager` keeps the certificates (prefetch, refresh at half life, backoff, forget);
:mod:`~ambit.identity.localca` is a CA on local disk for labs and tests; :mod:`~ambit.identity.caclient` holds
the errors of talking to a CA (and will hold the istiod gRPC client, spec §5.1-§5.2).

Errors::

    AmbitError
    └── CaError      (ambit.identity.caclient) fetching a certificate from the CA failed
"""
