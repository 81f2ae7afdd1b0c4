"""The protobuf schema of who may reach and do what: networking/v1 (NetworkPolicy), authentication/v1 (TokenRequest,
TokenReview) and authorization/v1 (the access reviews ``kubectl auth can-i`` sends).

Part of the table :mod:`ambit.apiserver.protobuf_schema` assembles (its docstring says how a field's Go type is read
and shown). Field numbers are those of k8s.io/api ``networking/v1``, ``authentication/v1`` and ``authorization/v1``
``generated.proto``.
"""

from __future__ import annotations

from ambit.apiserver.protobuf_schema_core import Message

ACCESS_MESSAGES: dict[str, Message] = {
    # -- k8s.io/api/networking/v1 -------------------------------------------------------------------------------
    "NetworkPolicy": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NetworkPolicySpec")},
    "NetworkPolicySpec": {
        1: ("podSelector", "LabelSelector"),
        2: ("ingress", "[]NetworkPolicyIngressRule"),
        3: ("egress", "[]NetworkPolicyEgressRule"),
        4: ("policyTypes", "[]string"),
    },
    "NetworkPolicyIngressRule": {1: ("ports", "[]NetworkPolicyPort"), 2: ("from", "[]NetworkPolicyPeer")},
    "NetworkPolicyEgressRule": {1: ("ports", "[]NetworkPolicyPort"), 2: ("to", "[]NetworkPolicyPeer")},
    "NetworkPolicyPeer": {
        1: ("podSelector", "*LabelSelector"),
        2: ("namespaceSelector", "*LabelSelector"),
        3: ("ipBlock", "*IPBlock"),
    },
    "IPBlock": {1: ("cidr", "string"), 2: ("except", "[]string")},
    "NetworkPolicyPort": {1: ("protocol", "*string"), 2: ("port", "*IntOrString"), 3: ("endPort", "*int32")},
    # -- k8s.io/api/authentication/v1 ---------------------------------------------------------------------------
    "TokenRequest": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "TokenRequestSpec"),
        3: ("status", "TokenRequestStatus"),
    },
    "TokenRequestSpec": {
        1: ("audiences", "[]string"),
        3: ("boundObjectRef", "*BoundObjectReference"),
        4: ("expirationSeconds", "*int64"),
    },
    "BoundObjectReference": {
        1: ("kind", "string"),
        2: ("apiVersion", "string"),
        3: ("name", "string"),
        4: ("uid", "string"),
    },
    "TokenRequestStatus": {1: ("token", "string"), 2: ("expirationTimestamp", "Time")},
    "TokenReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "TokenReviewSpec"), 3: ("status", "TokenReviewStatus")},
    "TokenReviewSpec": {1: ("token", "string"), 2: ("audiences", "[]string")},
    "TokenReviewStatus": {
        1: ("authenticated", "bool"),
        2: ("user", "UserInfo"),
        3: ("error", "string"),
        4: ("audiences", "[]string"),
    },
    "UserInfo": {
        1: ("username", "string"),
        2: ("uid", "string"),
        3: ("groups", "[]string"),
        4: ("extra", "map[string]ExtraValue"),
    },
    # -- k8s.io/api/authorization/v1 (what kubectl auth can-i sends) -------------------------------------------
    "SubjectAccessReview": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "SubjectAccessReviewSpec"),
        3: ("status", "SubjectAccessReviewStatus"),
    },
    "SubjectAccessReviewSpec": {
        1: ("resourceAttributes", "*ResourceAttributes"),
        2: ("nonResourceAttributes", "*NonResourceAttributes"),
        3: ("user", "string"),
        4: ("groups", "[]string"),
        5: ("extra", "map[string]ExtraValue"),
        6: ("uid", "string"),
    },
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "SelfSubjectAccessReviewSpec"),
        3: ("status", "SubjectAccessReviewStatus"),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "*ResourceAttributes"),
        2: ("nonResourceAttributes", "*NonResourceAttributes"),
    },
    "ResourceAttributes": {
        1: ("namespace", "string"),
        2: ("verb", "string"),
        3: ("group", "string"),
        4: ("version", "string"),
        5: ("resource", "string"),
        6: ("subresource", "string"),
        7: ("name", "string"),
    },
    "NonResourceAttributes": {1: ("path", "string"), 2: ("verb", "string")},
    "SubjectAccessReviewStatus": {
        1: ("allowed", "bool"),
        2: ("reason", "string"),
        3: ("evaluationError", "string"),
        4: ("denied", "bool"),
    },
    "SelfSubjectRulesReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SelfSubjectRulesReviewSpec")},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "string")},
}
