"""The embedded Kubernetes-compatible API server: REST over HTTPS, persisted in SQLite.

Theory of operation: every object lives in one SQLite table keyed by (resource, namespace, name) and carries the
global ``resourceVersion`` of its last write. Every write also appends a row to the event log, which is what
watches replay from; a watch that asks for a version older than the log's horizon gets ``410 Gone``. Pure pieces
(selectors, patches, tokens, tables, validation) are separate modules that never touch I/O.
"""
