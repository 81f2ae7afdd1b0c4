"""Seeing the mesh from outside: what an operator's tools read from the proxies (issue 20).

:mod:`ambit.observe.proxyconfig` turns a node proxy's admin ``/config_dump`` into istioctl-style tables (pure);
:mod:`ambit.observe.admin_client` fetches that dump, bounded in time and size.
"""
