"""The embedded Kubernetes-compatible API server: REST over HTTPS, persisted in SQLite.

Theory of operation: every object lives in one SQLite table keyed by (resource, namespace, name) and carries the
global ``resourceVersion`` of its last write. Every write also appends a row to the event log, which is what
watches replay from; a watch that asks for a version older than the log's horizon gets ``410 Gone``. Pure pieces
(selectors, patches, tokens, tables, validation) are separate modules that never touch I/O.

A request goes ``http`` (paths, bodies, responses; authentication, then ``authorizer``: impersonation and RBAC,
evaluated by the pure ``rbac_policy``, before anything is read or written) → ``verbs`` (get, list, create,
update, patch, delete), which forms the stored object with ``objects``, asks the kind's strategy in
``strategies`` where kinds differ, runs ``admission_chain`` and ``validation``, stores through ``store`` and
announces through ``watch``. Deletes are carried out by ``deletion``; ``scale``, ``token_requests`` and
``watch_cursor`` serve the scale subresource, TokenRequest/TokenReview and watches; ``authorizer`` also answers
access reviews, refuses RBAC escalation and keeps aggregated ClusterRoles up to date, and ``rbac_defaults`` holds
kube's bootstrap roles.
"""
