"""The node proxy's DNS proxy (spec §9): answers A/AAAA for mesh hostnames, forwards everything else.

Modules: ``names`` (the aliases a queried name stands for: search-path expansions and wildcards), ``answer`` (the
pure decision: a query and the workload state in, an answer or "forward" out), ``resolvconf`` (reading a
resolv.conf), ``forwarder`` (the asyncio shell that asks the pod's resolvers, from inside the pod's netns) and
``server`` (the asyncio shell on 15053: UDP datagrams and TCP streams, bounds, metrics, access log).

Errors::

    AmbitError
    └── DnsError                 (ambit.dns.errors) root of the DNS proxy's errors
        ├── ResolvConfError      a resolv.conf that names no usable nameserver
        └── UpstreamError        forwarding failed: every upstream timed out, refused or answered nonsense
"""
