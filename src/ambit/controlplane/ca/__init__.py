"""The mesh CA (istiod's ``IstioCertificateService``, spec §5): who may have which workload certificate.

Modules: ``authn`` (bearer token to :class:`~ambit.controlplane.ca.authn.Caller` via TokenReview), ``nodeauth``
(the node authorization rule for ``ImpersonatedIdentity``, and the pod index it consults), ``server`` (the gRPC
servicer and signer), ``root`` (the root in a Secret or plug-in files, published as ConfigMap
``istio-ca-root-cert`` in every namespace), ``home`` (the ``istio-system`` namespace the root Secret lives in,
created or waited for on a fresh cluster), ``errors`` (the error tree, with each error's gRPC status).

Wiring, in order: load the root (:func:`~ambit.controlplane.ca.root.load_or_create_root_secret` or
:func:`~ambit.controlplane.ca.root.load_plugin_ca`); start a
:class:`~ambit.controlplane.ca.nodeauth.InformerPodIndex` and a
:class:`~ambit.controlplane.ca.root.RootCertPublisher`; build
``CaService(KubeAuthenticator(client), NodeAuthorizer(index, trust_domain=...), RootSigner(root))`` and
``add_to_server`` it on the control plane's TLS ``grpc.aio`` server (port 15012, certificate from the same root).
"""
