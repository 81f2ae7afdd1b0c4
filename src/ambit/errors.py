"""The root of Ambit's exception tree.

Every error Ambit raises on purpose derives from :class:`AmbitError`, with a subtree per package::

    AmbitError
    ├── ApiError                 (ambit.apiserver.errors) a Kubernetes-style Status with a code and reason
    ├── PatchError               (ambit.k8s.patch) a JSON, merge or strategic merge patch that cannot be applied
    ├── KubeClientError          (ambit.k8s.errors) a request to an API server failed
    │   └── KubeApiStatusError   the server answered with a Status
    ├── CertificateError         (ambit.tls.certs) a malformed or mismatched certificate or key
    ├── ClientHelloError         (ambit.tls.clienthello) a peer's first bytes are no ClientHello to route by
    ├── PeerIdentityError        (ambit.tls.spiffe) a peer certificate without the expected SPIFFE identity
    ├── ModelError               (ambit.model.errors) IdentityError, AddressError, LocalConfigError, NoHealthyUpstream…
    ├── CaError                  (ambit.identity.caclient) fetching a workload certificate failed
    ├── HttpFetchError           (ambit.httpfetch) a bounded GET failed: unreachable, slow, too large, not 200
    ├── HboneError               (ambit.hbone.errors) HboneProtocolError (peer), AuthorityError
    ├── ProxyProtocolError       (ambit.proxyprotocol) a PROXY header not encodable; ProxyHeaderError (peer)
    ├── ProxyError               (ambit.proxy.errors) ProxyConnectError, StreamClosedError, HboneConnectError, ...
    ├── WaypointError            (ambit.waypoint.errors) HttpProtocolError (peer), WaypointSettingsError
    ├── TelemetryError           (ambit.telemetry) an endpoint could not start; BadLogLevelError
    ├── ProxyConfigError         (ambit.observe) ConfigDumpError (the proxy's dump), AdminFetchError
    ├── XdsError                 (ambit.xds.errors) XdsConversionError, XdsProtocolError, XdsConfigFileError
    ├── CaServerError            (ambit.controlplane.ca.errors) AuthenticationError, AuthorizationError, CsrError
    ├── WebhookError             (ambit.controlplane.webhook.errors) MalformedReviewError, RegistrationError, ...
    ├── GatewayControllerError   (ambit.controlplane.gateway.controller) the waypoint deployer could not start
    ├── WaypointCommandError     (ambit.cli.waypoint) bad input to ``ambit waypoint apply|list|status|delete``
    ├── CniError, RedirectError, ZdsError   (ambit.cni, ambit.redirect, ambit.zds) enrolment
    ├── EventLoopError           (ambit.inpod.eventloop) an unknown or missing event loop
    ├── CommandError             (ambit.commands) a command exited non-zero or could not be started
    ├── TaskEndedError           (ambit.supervision) a daemon's essential task ended: the daemon exits non-zero
    └── LabError, CniInvocationError  (ambit.lab) the single-machine cluster

Blame is explicit: an error caused by what a peer sent says so in its class name or reason.
"""

from __future__ import annotations


class AmbitError(Exception):
    """Base class of every error Ambit raises on purpose."""
