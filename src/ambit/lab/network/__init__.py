"""The lab's network: addresses, names and file layout (:mod:`.topology`, pure), the bridge, node namespaces and
routes (:mod:`.bridge`), the runtime side of CNI that attaches pods by invoking plugins (:mod:`.plugins`), and
kube-proxy's Service rules (:mod:`.services`, pure rendering; :mod:`.services_apply`, applying and keeping them
current), and a CNI's NetworkPolicy enforcement (:mod:`.policy_objects` and :mod:`.policies`, pure reading and
rendering; :mod:`.policies_apply`, applying and keeping them current).
"""
