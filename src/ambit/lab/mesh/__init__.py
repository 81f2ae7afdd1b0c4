"""The mesh inside the lab: the node proxies' config file kept current from the cluster (:mod:`.config`) and the
node proxies' credentials as a cluster gives them to ztunnel (:mod:`.identity`).
"""
