"""The mesh inside the lab: its system namespaces (:mod:`.accounts`) and its installation from
``deploy/overlays/lab`` as on a cluster (:mod:`.install`).
"""
