"""The names a DNS query may stand for, as ztunnel expands them (spec §9; zt:src/dns/server.rs ``get_aliases``).

Theory of operation: a name is a tuple of lower-case labels without the root (``("reviews", "default")``). A pod
asks for a short name (``reviews``), a partly qualified one (``reviews.other``, ``reviews.other.svc``), a full one,
or one its resolver already joined to a search domain (``api.example.com.default.svc.cluster.local``, which a
resolver with ``ndots:5`` tries first). :func:`aliases` lists, in order, the names to look the services up by:

1. the name itself;
2. its Kubernetes expansions in the client's namespace (:func:`kube_fqdns`);
3. for each search domain of the client (``<ns>.svc.<domain>``, ``svc.<domain>``, ``<domain>``: the kubelet's
   search path for a pod of that namespace) that the name ends with, the name without it ("stripped"), then the
   expansions of the stripped name. An answer found through a stripped alias is a CNAME from the asked name to
   the stripped one, then the addresses (:mod:`ambit.dns.answer`).

A name appears once, at its first place. :func:`wildcards` then gives, for each alias, the alias and the
wildcard hosts that cover it (``*.example.com``, ``*.com``), most specific first.

Kubernetes expansions (``kube_fqdns``) by number of labels ``n``:

- ``n == 1``: ``name.<ns>.svc.<domain>``;
- ``n == 2``: ``name.svc.<domain>`` (``service.namespace``) and ``name.<ns>.svc.<domain>`` (``host.subdomain``);
- ``n == 3``: ``name.<domain>`` when the last label is ``svc``, and ``name.svc.<domain>``;
- ``n == 4`` ending in ``svc``: ``name.<domain>``; otherwise nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Alias:
    """A name to look up; ``stripped`` is the asked name without a search domain when the alias came from it."""

    name: Labels
    stripped: Labels | None = None


def split(hostname: str) -> Labels:
    """A dotted host name as labels (lower case, no empty labels)."""
    return tuple(label for label in hostname.lower().split(".") if label)


def join(labels: Labels) -> str:
    return ".".join(labels)


def has_domain(name: Labels, domain: Labels) -> bool:
    """Whether ``name`` is strictly below ``domain``."""
    return len(name) > len(domain) and name[len(name) - len(domain) :] == domain


def search_domains(namespace: str, domain: Labels) -> tuple[Labels, ...]:
    """The kubelet's search path for a pod of ``namespace``."""
    return ((namespace, "svc", *domain), ("svc", *domain), domain)


def kube_fqdns(name: Labels, namespace: str, domain: Labels) -> list[Labels]:
    """The Kubernetes expansions of ``name`` for a client in ``namespace`` (see the module docstring)."""
    svc_domain = ("svc", *domain)
    namespaced = (namespace, *svc_domain)
    n = len(name)
    if n == 1:
        return [name + namespaced]
    if n == 2:
        return [name + svc_domain, name + namespaced]
    if n == 3:
        out = [name + domain] if name[-1] == "svc" else []
        return [*out, name + svc_domain]
    if n == 4 and name[-1] == "svc":
        return [name + domain]
    return []


def aliases(name: Labels, namespace: str, domain: Labels) -> list[Alias]:
    """Every alias of ``name`` for a client in ``namespace``, in lookup order, each name once (rules 1-3)."""
    out: list[Alias] = []
    seen: set[Labels] = set()

    def add(alias: Alias) -> None:
        if alias.name not in seen:
            seen.add(alias.name)
            out.append(alias)

    add(Alias(name))
    for fqdn in kube_fqdns(name, namespace, domain):
        add(Alias(fqdn))
    for search in search_domains(namespace, domain):
        if has_domain(name, search):
            stripped = name[: len(name) - len(search)]
            add(Alias(stripped, stripped))
            for fqdn in kube_fqdns(stripped, namespace, domain):
                add(Alias(fqdn, stripped))
    return out


def wildcards(name: Labels) -> list[Labels]:
    """``name``, then each wildcard that covers it, most specific first: ``a.b.c`` → ``a.b.c``, ``*.b.c``, ``*.c``."""
    out = [name]
    rest = name
    while len(rest) > 1:
        out.append(("*", *rest[1:]))
        rest = rest[1:]
    return out
