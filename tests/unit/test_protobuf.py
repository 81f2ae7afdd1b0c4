"""Kubernetes protobuf request bodies → their JSON form: real kubectl bodies, hand-built ones, malformed ones."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.protobuf_wire import decode, entry, envelope, int_or_string, ln, meta, num, time, varint

from ambit.apiserver.errors import ApiError
from ambit.apiserver.protobuf import MAGIC, SCHEMA
from ambit.apiserver.protobuf_schema import ANY_VERSION_KINDS, KINDS, MESSAGES

# -- bodies captured from kubectl v1.32 ---------------------------------------------------------------------------
KUBECTL_BODIES = {
    "create namespace ns1": (
        "azhzAAoPCgJ2MRIJTmFtZXNwYWNlEhsKEwoDbnMxEgAaACIAKgAyADgAQgASABoCCgAaACIA",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}},
    ),
    "create configmap cm1 --from-literal=a=b --from-literal=c=d": (
        "azhzAAoPCgJ2MRIJQ29uZmlnTWFwEiUKEwoDY20xEgAaACIAKgAyADgAQgASBgoBYRIBYhIGCgFjEgFkGgAiAA==",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"a": "b", "c": "d"}},
    ),
    "create secret generic s1 --from-literal=user=admin --from-literal=pw=s3cret": (
        "azhzAAoMCgJ2MRIGU2VjcmV0EjMKEgoCczESABoAIgAqADIAOABCABIMCgJwdxIGczNjcmV0Eg0KBHVzZXISBWFkbWluGgAaACIA",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s1"},
            "data": {"pw": base64.b64encode(b"s3cret").decode(), "user": base64.b64encode(b"admin").decode()},
        },
    ),
    "create serviceaccount sa1": (
        "azhzAAoUCgJ2MRIOU2VydmljZUFjY291bnQSFQoTCgNzYTESABoAIgAqADIAOABCABoAIgA=",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa1"}},
    ),
    "create token sa1": (
        "azhzAAooChhhdXRoZW50aWNhdGlvbi5rOHMuaW8vdjESDFRva2VuUmVxdWVzdBIaChAKABIAGgAiACoAMgA4AEIAEgAaBAoAEgAaACIA",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"},
    ),
    "create token sa1 --duration=1h --audience=foo": (
        "azhzAAooChhhdXRoZW50aWNhdGlvbi5rOHMuaW8vdjESDFRva2VuUmVxdWVzdBIiChAKABIAGgAiACoAMgA4AEIAEggKA2ZvbyCQHBoE"
        "CgASABoAIgA=",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["foo"], "expirationSeconds": 3600},
        },
    ),
    "create deployment dep1 --image=nginx:1.27 --replicas=2 --port=80": (
        "azhzAAoVCgdhcHBzL3YxEgpEZXBsb3ltZW50EsEBCiEKBGRlcDESABoAIgAqADIAOABCAFoLCgNhcHASBGRlcDESjQEIAhINCgsKA2Fw"
        "cBIEZGVwMRpyCh0KABIAGgAiACoAMgA4AEIAWgsKA2FwcBIEZGVwMRJREjMKBW5naW54EgpuZ2lueDoxLjI3KgAyCgoAEAAYUCIAKgBC"
        "AGoAcgCAAQCIAQCQAQCiAQAaADIAQgBKAFIAWABgAGgAggEAigEAmgEAwgEAIgIKACgAOAAaDAgAEAAYACAAKAA4ABoAIgA=",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "dep1", "labels": {"app": "dep1"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "dep1"}},
                "template": {
                    "metadata": {"labels": {"app": "dep1"}},
                    "spec": {
                        "containers": [{"name": "nginx", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]
                    },
                },
            },
        },
    ),
    "create service clusterip svc1 --tcp=80:8080": (
        "azhzAAoNCgJ2MRIHU2VydmljZRJsCiEKBHN2YzESABoAIgAqADIAOABCAFoLCgNhcHASBHN2YzESQwobCgc4MC04MDgwEgNUQ1AYUCIH"
        "CAAQkD8aACgAEgsKA2FwcBIEc3ZjMRoAIglDbHVzdGVySVA6AEIAUgBaAGAAaAAaAgoAGgAiAA==",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc1", "labels": {"app": "svc1"}},
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "selector": {"app": "svc1"},
                "type": "ClusterIP",
            },
        },
    ),
    "create service externalname en1 --external-name=example.com": (
        "azhzAAoNCgJ2MRIHU2VydmljZRJaCh8KA2VuMRIAGgAiACoAMgA4AEIAWgoKA2FwcBIDZW4xEjMSCgoDYXBwEgNlbjEaACIMRXh0ZXJu"
        "YWxOYW1lOgBCAFILZXhhbXBsZS5jb21aAGAAaAAaAgoAGgAiAA==",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "en1", "labels": {"app": "en1"}},
            "spec": {"selector": {"app": "en1"}, "type": "ExternalName", "externalName": "example.com"},
        },
    ),
}


@pytest.mark.parametrize("command", list(KUBECTL_BODIES))
def test_kubectl_bodies_decode_to_the_json_kubectl_would_have_sent(command: str) -> None:
    body, expected = KUBECTL_BODIES[command]
    assert decode(base64.b64decode(body)) == expected


# -- kinds, field by field ----------------------------------------------------------------------------------------
def test_configmap_binary_data_is_base64_and_immutable_false_is_kept() -> None:
    blob = bytes(range(256))
    body = envelope("v1", "ConfigMap", meta("cm"), entry(2, "k", "v"), entry(3, "bin", blob), num(4, 0))
    assert decode(body) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm"},
        "data": {"k": "v"},
        "binaryData": {"bin": base64.b64encode(blob).decode()},
        "immutable": False,
    }


def test_secret_type_string_data_and_empty_value() -> None:
    body = envelope("v1", "Secret", meta("s"), entry(2, "empty", b""), ln(3, "kubernetes.io/tls"), entry(4, "a", "b"))
    assert decode(body) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "data": {"empty": ""},
        "type": "kubernetes.io/tls",
        "stringData": {"a": "b"},
    }


def test_object_meta_in_full() -> None:
    owner = ln(5, "apps/v1") + ln(1, "ReplicaSet") + ln(3, "web-1") + ln(4, "u-1") + num(6, 1) + num(7, 0)
    fields = (
        ln(1, "web")
        + ln(2, "web-")
        + ln(3, "prod")
        + ln(5, "uid-9")
        + ln(6, "42")
        + num(7, 3)
        + ln(8, time(1_700_000_000))
        + ln(9, time(1_700_000_030))
        + num(10, 0)
        + entry(11, "app", "web")
        + entry(12, "note", "hi")
        + ln(13, owner)
        + ln(14, "example.com/cleanup")
        + ln(17, ln(1, "kubectl"))  # managedFields: skipped
    )
    obj = decode(envelope("v1", "ConfigMap", ln(1, fields)))
    assert obj["metadata"] == {
        "name": "web",
        "generateName": "web-",
        "namespace": "prod",
        "uid": "uid-9",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2023-11-14T22:13:20Z",
        "deletionTimestamp": "2023-11-14T22:13:50Z",
        "deletionGracePeriodSeconds": 0,
        "labels": {"app": "web"},
        "annotations": {"note": "hi"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-1",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": False,
            }
        ],
        "finalizers": ["example.com/cleanup"],
    }


def test_pod_spec_with_volumes_probes_env_and_security_context() -> None:
    container = (
        ln(1, "app")
        + ln(2, "busybox:1.36")
        + ln(3, "sleep")
        + ln(4, "3600")
        + ln(6, ln(1, "http") + num(3, 8080) + ln(4, "TCP"))
        + ln(7, ln(1, "A") + ln(2, "B"))
        + ln(7, ln(1, "PW") + ln(3, ln(4, ln(1, ln(1, "creds")) + ln(2, "password") + num(3, 1))))
        + ln(7, ln(1, "NODE") + ln(3, ln(1, ln(1, "v1") + ln(2, "spec.nodeName"))))
        + ln(19, ln(1, "CFG_") + ln(2, ln(1, ln(1, "settings"))))
        + ln(8, entry(1, "cpu", ln(1, "500m")) + entry(2, "memory", ln(1, "64Mi")))
        + ln(9, ln(1, "data") + num(2, 1) + ln(3, "/data"))
        + ln(10, ln(1, ln(2, ln(1, "/healthz") + ln(2, int_or_string("http")))) + num(2, 5) + num(4, 10))
        + ln(11, ln(1, ln(3, ln(1, int_or_string(8080)))))
        + ln(22, ln(1, ln(1, ln(1, "cat"), ln(1, "/ready"))) + num(6, 30))
        + ln(12, ln(2, ln(1, ln(1, "sh"))))
        + ln(15, ln(1, ln(2, "ALL")) + num(4, 0) + num(5, 1) + num(7, 0) + ln(11, ln(1, "RuntimeDefault")))
        + ln(13, "")  # zero values of plain fields, as gogo-protobuf writes them
        + num(16, 0)
    )
    volumes = (
        ln(1, ln(1, "data"), ln(2, ln(2, b"")))
        + ln(1, ln(1, "cfg"), ln(2, ln(19, ln(1, ln(1, "settings")) + num(3, 0o644))))
        + ln(1, ln(1, "sec"), ln(2, ln(6, ln(1, "creds") + ln(2, ln(1, "k") + ln(2, "p") + num(3, 0o400)))))
        + ln(
            1,
            ln(1, "token"),
            ln(2, ln(26, ln(1, ln(4, ln(1, "istio-ca") + num(2, 43200) + ln(3, "istio-token"))))),
        )
        + ln(1, ln(1, "info"), ln(2, ln(16, ln(1, ln(1, "labels") + ln(2, ln(2, "metadata.labels"))))))
        + ln(1, ln(1, "scratch"), ln(2, ln(2, ln(1, "Memory") + ln(2, ln(1, "1Gi")))))
    )
    spec = (
        volumes
        + ln(2, container)
        + ln(20, ln(1, "init") + ln(2, "busybox") + ln(24, "Always"))
        + ln(3, "Never")
        + num(4, 0)
        + entry(7, "disk", "ssd")
        + ln(8, "runner")
        + num(21, 0)
        + ln(14, num(2, 1000) + ln(4, varint(1)) + num(4, 2))
        + ln(15, ln(1, "pull"))
        + ln(22, ln(1, "node.kubernetes.io/not-ready") + ln(2, "Exists") + ln(4, "NoExecute") + num(5, 300))
        + ln(
            18,
            ln(
                1,
                ln(1, ln(1, ln(1, ln(1, "zone") + ln(2, "In") + ln(3, "a") + ln(3, "b")))),
            ),
        )
    )
    obj = decode(envelope("v1", "Pod", meta("web", "prod"), ln(2, spec), ln(3, ln(1, "Pending"))))
    assert obj == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "settings", "defaultMode": 420}},
                {"name": "sec", "secret": {"secretName": "creds", "items": [{"key": "k", "path": "p", "mode": 256}]}},
                {
                    "name": "token",
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "audience": "istio-ca",
                                    "expirationSeconds": 43200,
                                    "path": "istio-token",
                                }
                            }
                        ]
                    },
                },
                {
                    "name": "info",
                    "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
                },
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            ],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "command": ["sleep"],
                    "args": ["3600"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {"name": "A", "value": "B"},
                        {
                            "name": "PW",
                            "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password", "optional": True}},
                        },
                        {"name": "NODE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
                    ],
                    "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
                    "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "64Mi"}},
                    "volumeMounts": [{"name": "data", "readOnly": True, "mountPath": "/data"}],
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "initialDelaySeconds": 5,
                        "periodSeconds": 10,
                    },
                    "readinessProbe": {"tcpSocket": {"port": 8080}},
                    "startupProbe": {"exec": {"command": ["cat", "/ready"]}, "failureThreshold": 30},
                    "lifecycle": {"preStop": {"exec": {"command": ["sh"]}}},
                    "securityContext": {
                        "capabilities": {"drop": ["ALL"]},
                        "runAsUser": 0,
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
            "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"disk": "ssd"},
            "serviceAccountName": "runner",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 1000, "supplementalGroups": [1, 2]},
            "imagePullSecrets": [{"name": "pull"}],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                        ]
                    }
                }
            },
        },
        "status": {"phase": "Pending"},
    }


def test_deployment_keeps_zero_pointers_and_reads_int_or_string_percentages() -> None:
    strategy = ln(1, "RollingUpdate") + ln(2, ln(1, int_or_string("25%")) + ln(2, int_or_string(0)))
    spec = (
        num(1, 0)
        + ln(2, ln(2, ln(1, "tier") + ln(2, "NotIn") + ln(3, "cache")))
        + ln(3, meta("ignored-but-decoded"), ln(2, ln(2, ln(1, "c") + ln(2, "i"))))
        + ln(4, strategy)
        + num(5, 0)
        + num(6, 0)
        + num(7, 1)
        + num(9, 600)
    )
    obj = decode(envelope("apps/v1", "Deployment", meta("d"), ln(2, spec)))
    assert obj["spec"] == {
        "replicas": 0,
        "selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cache"]}]},
        "template": {
            "metadata": {"name": "ignored-but-decoded"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}},
        "revisionHistoryLimit": 0,
        "paused": True,
        "progressDeadlineSeconds": 600,
    }


def test_network_policy_with_every_peer_and_port_shape() -> None:
    labels = entry(1, "app", "httpbin")
    ports = ln(1, ln(1, "TCP") + ln(2, int_or_string(15008))) + ln(1, ln(2, int_or_string("http")))
    ports += ln(1, ln(2, int_or_string(9000)) + num(3, 9010))
    peers = ln(2, ln(1, labels) + ln(2, b"")) + ln(2, ln(3, ln(1, "10.0.0.0/8") + ln(2, "10.1.0.0/16")))
    spec = ln(1, labels) + ln(2, ports + peers) + ln(3, ln(2, ln(2, b""))) + ln(4, "Ingress") + ln(4, "Egress")
    obj = decode(envelope("networking.k8s.io/v1", "NetworkPolicy", meta("only-hbone", "default"), ln(2, spec)))
    assert obj["spec"] == {
        "podSelector": {"matchLabels": {"app": "httpbin"}},
        "ingress": [
            {
                "ports": [
                    {"protocol": "TCP", "port": 15008},
                    {"port": "http"},
                    {"port": 9000, "endPort": 9010},
                ],
                "from": [
                    {"podSelector": {"matchLabels": {"app": "httpbin"}}, "namespaceSelector": {}},
                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                ],
            }
        ],
        "egress": [{"to": [{"namespaceSelector": {}}]}],
        "policyTypes": ["Ingress", "Egress"],
    }


def test_replicaset_and_daemonset() -> None:
    template = ln(3, meta("t"))
    rs = decode(envelope("apps/v1", "ReplicaSet", meta("rs"), ln(2, num(1, 3) + num(4, 5) + template)))
    assert rs["spec"] == {"replicas": 3, "minReadySeconds": 5, "template": {"metadata": {"name": "t"}}}
    update = ln(1, "RollingUpdate") + ln(2, ln(1, int_or_string(1)))
    ds = decode(envelope("apps/v1", "DaemonSet", meta("ds"), ln(2, ln(2, meta("t")) + ln(3, update) + num(6, 2))))
    assert ds["spec"] == {
        "template": {"metadata": {"name": "t"}},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "revisionHistoryLimit": 2,
    }


def test_job_and_cron_job_keep_zero_pointers() -> None:
    template = meta("t") + ln(2, ln(3, "Never"))
    spec = (
        num(1, 0)
        + num(2, 3)
        + num(3, 60)
        + ln(4, entry(1, "app", "pi"))
        + num(5, 1)
        + ln(6, template)
        + num(7, 0)
        + num(8, 0)
        + ln(9, "Indexed")
        + num(10, 0)
        + ln(14, "Failed")
    )
    status = ln(2, time(1_700_000_000)) + num(4, 1) + num(5, 2) + ln(7, "0-1") + ln(8, ln(1, "u1")) + num(9, 0)
    obj = decode(envelope("batch/v1", "Job", meta("pi"), ln(2, spec), ln(3, status)))
    assert obj["spec"] == {
        "parallelism": 0,
        "completions": 3,
        "activeDeadlineSeconds": 60,
        "selector": {"matchLabels": {"app": "pi"}},
        "manualSelector": True,
        "template": {"metadata": {"name": "t"}, "spec": {"restartPolicy": "Never"}},
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": 0,
        "completionMode": "Indexed",
        "suspend": False,
        "podReplacementPolicy": "Failed",
    }
    assert obj["status"] == {
        "startTime": "2023-11-14T22:13:20Z",
        "active": 1,
        "succeeded": 2,
        "completedIndexes": "0-1",
        "uncountedTerminatedPods": {"succeeded": ["u1"]},
        "ready": 0,
    }
    cron_spec = ln(1, "*/5 * * * *") + num(2, 0) + ln(3, "Forbid") + num(4, 1) + ln(5, ln(2, num(7, 2)))
    cron_spec += num(6, 0) + num(7, 1) + ln(8, "UTC")
    cron = decode(envelope("batch/v1", "CronJob", meta("tick"), ln(2, cron_spec)))
    assert cron["spec"] == {
        "schedule": "*/5 * * * *",
        "startingDeadlineSeconds": 0,
        "concurrencyPolicy": "Forbid",
        "suspend": True,
        "jobTemplate": {"spec": {"backoffLimit": 2}},
        "successfulJobsHistoryLimit": 0,
        "failedJobsHistoryLimit": 1,
        "timeZone": "UTC",
    }


def test_statefulset_with_a_partition_claim_templates_and_its_status() -> None:
    update = ln(1, "RollingUpdate") + ln(2, num(1, 0) + ln(2, int_or_string("50%")))
    claim_spec = ln(1, "ReadWriteOnce") + ln(2, entry(2, "storage", ln(1, "1Gi"))) + ln(5, "")
    spec = (
        num(1, 3)
        + ln(2, entry(1, "app", "web"))
        + ln(3, meta("t"))
        + ln(4, meta("data"), ln(2, claim_spec))
        + ln(5, "web")
        + ln(6, "Parallel")
        + ln(7, update)
        + num(8, 0)
        + num(9, 5)
        + ln(10, ln(1, "Delete") + ln(2, "Retain"))
        + ln(11, num(1, 1))
    )
    status = num(1, 2) + num(2, 3) + num(3, 3) + ln(6, "web-1") + ln(7, "web-2") + num(9, 0) + num(11, 3)
    obj = decode(envelope("apps/v1", "StatefulSet", meta("web"), ln(2, spec), ln(3, status)))
    assert obj["spec"] == {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"name": "t"}},
        "volumeClaimTemplates": [
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                },
            }
        ],
        "serviceName": "web",
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": "50%"}},
        "revisionHistoryLimit": 0,
        "minReadySeconds": 5,
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
        "ordinals": {"start": 1},
    }
    assert obj["status"] == {
        "observedGeneration": 2,
        "replicas": 3,
        "readyReplicas": 3,
        "currentRevision": "web-1",
        "updateRevision": "web-2",
        "collisionCount": 0,
        "availableReplicas": 3,
    }


def test_service_with_node_ports_and_session_affinity() -> None:
    port = ln(1, "https") + ln(2, "TCP") + num(3, 443) + ln(4, int_or_string("web")) + num(5, 30443) + ln(6, "h2")
    spec = (
        ln(1, port)
        + ln(3, "None")
        + ln(4, "LoadBalancer")
        + ln(7, "ClientIP")
        + ln(14, ln(1, num(1, 10800)))
        + ln(17, "SingleStack")
        + ln(18, "None")
        + ln(19, "IPv4")
        + num(20, 0)
        + ln(22, "Local")
    )
    status = ln(1, ln(1, ln(1, "203.0.113.7")))
    obj = decode(envelope("v1", "Service", meta("s"), ln(2, spec), ln(3, status)))
    assert obj["spec"] == {
        "ports": [
            {
                "name": "https",
                "protocol": "TCP",
                "port": 443,
                "targetPort": "web",
                "nodePort": 30443,
                "appProtocol": "h2",
            }
        ],
        "clusterIP": "None",
        "type": "LoadBalancer",
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
        "ipFamilyPolicy": "SingleStack",
        "clusterIPs": ["None"],
        "ipFamilies": ["IPv4"],
        "allocateLoadBalancerNodePorts": False,
        "internalTrafficPolicy": "Local",
    }
    assert obj["status"] == {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}


def test_service_account_and_namespace() -> None:
    sa = decode(envelope("v1", "ServiceAccount", meta("sa"), ln(2, ln(3, "tok")), ln(3, ln(1, "pull")), num(4, 0)))
    assert sa == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "sa"},
        "secrets": [{"name": "tok"}],
        "imagePullSecrets": [{"name": "pull"}],
        "automountServiceAccountToken": False,
    }
    ns = decode(envelope("v1", "Namespace", meta("n"), ln(2, ln(1, "kubernetes")), ln(3, ln(1, "Active"))))
    assert ns["spec"] == {"finalizers": ["kubernetes"]} and ns["status"] == {"phase": "Active"}


def test_token_request_with_a_bound_pod() -> None:
    bound = ln(1, "Pod") + ln(2, "v1") + ln(3, "web-0") + ln(4, "uid-1")
    spec = ln(1, "istio-ca") + ln(1, "https://kubernetes.default.svc") + num(4, 7200) + ln(3, bound)
    obj = decode(envelope("authentication.k8s.io/v1", "TokenRequest", ln(2, spec)))
    assert obj["spec"] == {
        "audiences": ["istio-ca", "https://kubernetes.default.svc"],
        "expirationSeconds": 7200,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web-0", "uid": "uid-1"},
    }


def test_token_review_with_extra_values() -> None:
    user = ln(1, "system:serviceaccount:a:b") + ln(3, "g1") + entry(4, "scopes", ln(1, "x") + ln(1, "y"))
    status = num(1, 1) + ln(2, user) + ln(4, "aud")
    obj = decode(envelope("authentication.k8s.io/v1", "TokenReview", ln(2, ln(1, "t0k") + ln(2, "aud")), ln(3, status)))
    assert obj["spec"] == {"token": "t0k", "audiences": ["aud"]}
    assert obj["status"] == {
        "authenticated": True,
        "user": {"username": "system:serviceaccount:a:b", "groups": ["g1"], "extra": {"scopes": ["x", "y"]}},
        "audiences": ["aud"],
    }


def test_lease_micro_times_and_zero_pointers() -> None:
    spec = ln(1, "istiod-1") + num(2, 15) + ln(3, time(0, 5_000)) + ln(4, time(1_700_000_000, 123_456_789)) + num(5, 0)
    obj = decode(envelope("coordination.k8s.io/v1", "Lease", meta("l"), ln(2, spec)))
    assert obj["spec"] == {
        "holderIdentity": "istiod-1",
        "leaseDurationSeconds": 15,
        "acquireTime": "1970-01-01T00:00:00.000005Z",
        "renewTime": "2023-11-14T22:13:20.123456Z",
        "leaseTransitions": 0,
    }


def test_event_and_endpoints() -> None:
    event = decode(
        envelope(
            "v1",
            "Event",
            meta("e"),
            ln(2, ln(1, "Pod") + ln(3, "web")),
            ln(3, "Pulled"),
            ln(5, ln(1, "kubelet")),
            ln(6, time(1_700_000_000)),
            num(8, 2),
            ln(9, "Normal"),
            ln(10, b""),  # a zero MicroTime
        )
    )
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "name": "web"},
        "reason": "Pulled",
        "source": {"component": "kubelet"},
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "count": 2,
        "type": "Normal",
    }
    subset = ln(1, ln(1, "10.0.0.1") + ln(2, ln(1, "Pod") + ln(3, "web"))) + ln(3, ln(1, "http") + num(2, 80))
    endpoints = decode(envelope("v1", "Endpoints", meta("svc"), ln(2, subset)))
    assert endpoints["subsets"] == [
        {
            "addresses": [{"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "name": "web"}}],
            "ports": [{"name": "http", "port": 80}],
        }
    ]


def test_delete_options_are_accepted_under_any_api_version() -> None:
    raw = num(1, 0) + ln(2, ln(1, "uid-1")) + ln(4, "Foreground") + ln(5, "All")
    for api_version in ("v1", "apps/v1", "meta.k8s.io/v1"):
        assert decode(envelope(api_version, "DeleteOptions", raw)) == {
            "apiVersion": api_version,
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": "uid-1"},
            "propagationPolicy": "Foreground",
            "dryRun": ["All"],
        }


# -- the wire format's corners ------------------------------------------------------------------------------------
def test_negative_numbers_are_two_s_complement() -> None:
    obj = decode(envelope("v1", "Pod", meta("p", generation=num(7, -1)), ln(2, ln(14, num(2, -5)) + num(25, -7))))
    assert obj["metadata"]["generation"] == -1
    assert obj["spec"] == {"securityContext": {"runAsUser": -5}, "priority": -7}


def test_packed_and_unpacked_repeated_numbers_both_read() -> None:
    packed = ln(4, varint(5) + varint(6) + varint(1 << 40))
    obj = decode(envelope("v1", "Pod", ln(2, ln(14, num(4, 4) + packed))))
    assert obj["spec"]["securityContext"]["supplementalGroups"] == [4, 5, 6, 1 << 40]


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    fixed64 = varint(99 << 3 | 1) + bytes(8)
    fixed32 = varint(98 << 3 | 5) + bytes(4)
    body = envelope("v1", "ConfigMap", meta("cm"), fixed64, fixed32, num(97, 12345), ln(96, b"\xff\x00junk"))
    body += ln(9, "an unknown envelope field")
    assert decode(body) == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}


def test_the_last_value_of_a_repeated_scalar_field_wins() -> None:
    assert decode(envelope("v1", "Secret", ln(3, "A"), ln(3, "B")))["type"] == "B"
    assert "type" not in decode(envelope("v1", "Secret", ln(3, "A"), ln(3, "")))


def test_invalid_utf8_is_replaced_as_go_json_does() -> None:
    assert decode(envelope("v1", "ConfigMap", entry(2, "k", b"a\xffb")))["data"] == {"k": "a\ufffdb"}


def test_times_before_year_1000_are_zero_padded_and_the_zero_time_is_null() -> None:
    assert decode(envelope("v1", "Pod", meta(creationTimestamp=ln(8, time(-62135596800 + 86400)))))["metadata"] == {
        "name": "x",
        "creationTimestamp": "0001-01-02T00:00:00Z",
    }
    zero = decode(envelope("v1", "Pod", meta(creationTimestamp=ln(8, time(-62135596800)), deletion=ln(9, b""))))
    assert zero["metadata"] == {"name": "x"}


def test_a_map_entry_without_a_value_holds_the_zero_value() -> None:
    obj = decode(envelope("v1", "ConfigMap", ln(2, ln(1, "k")), ln(3, ln(1, "b"))))
    assert obj["data"] == {"k": ""} and obj["binaryData"] == {"b": ""}
    resources = decode(envelope("v1", "Pod", ln(2, ln(2, ln(8, ln(1, ln(1, "cpu")))))))
    assert resources["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "0"}}


# -- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        (b'{"kind": "ConfigMap"}', 400, "magic"),
        (b"", 400, "magic"),
        (MAGIC + b"\x0a", 400, "ends inside a varint"),
        (MAGIC + b"\x0a\x05\x0a\x01", 400, "longer than what is left"),
        (MAGIC + b"\x08" + b"\xff" * 11, 400, "longer than 10 bytes"),
        (MAGIC + b"\x0b", 400, "wire type 3"),
        (MAGIC + b"\x02\x00", 400, "field number 0"),
        (MAGIC + ln(2, b""), 400, "apiVersion and kind"),
        (MAGIC + num(1, 5), 400, "typeMeta"),
        (envelope("v1", "Widget", b""), 415, "Widget (v1) cannot be sent as protobuf"),
        (envelope("apps/v1", "Pod", b""), 415, "Pod (apps/v1)"),
        (envelope("v1", "ConfigMap", b"", encoding="gzip"), 415, "gzip"),
        (envelope("v1", "ConfigMap", b"", content_type="application/json"), 415, "application/json"),
        (envelope("v1", "ConfigMap", num(1, 7)), 400, "at metadata: expected a length-delimited field"),
        (envelope("apps/v1", "Deployment", ln(2, ln(1, "x"))), 400, "at spec.replicas: expected a varint"),
        (
            envelope("v1", "Pod", ln(2, ln(2, ln(6, num(3, 1) + b"\x1a")))),
            400,
            "at spec.containers[0].ports[0]: the body ends inside a varint",
        ),
        (envelope("v1", "Service", ln(2, ln(1, ln(4, num(1, 2))))), 400, "IntOrString has type 2"),
        (envelope("v1", "Pod", meta(creationTimestamp=ln(8, time(1 << 40)))), 400, "out of range"),
        (envelope("v1", "Pod", meta(creationTimestamp=ln(8, time(0, 1_000_000_000)))), 400, "out of range"),
    ],
)
def test_malformed_bodies_are_rejected_with_a_clear_message(body: bytes, code: int, text: str) -> None:
    with pytest.raises(ApiError) as caught:
        decode(body)
    assert caught.value.code == code
    assert text in caught.value.message


def test_the_schema_names_only_known_messages_and_unique_json_names() -> None:
    assert set(SCHEMA) == set(MESSAGES)
    for kind_message in [*KINDS.values(), *ANY_VERSION_KINDS.values()]:
        assert kind_message in MESSAGES
    for name, fields in SCHEMA.items():
        names = [f.name for f in fields.values() if not f.inline]
        assert len(names) == len(set(names)), name


# -- fuzzing ------------------------------------------------------------------------------------------------------
@st.composite
def _field_soup(draw: st.DrawFn, depth: int = 3) -> bytes:
    """Random, mostly well-formed protobuf: small field numbers, so that it lands on schema fields."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 40))
        wire = draw(st.sampled_from([0, 0, 1, 2, 2, 2, 5]))
        if wire == 0:
            parts.append(num(number, draw(st.integers(-(1 << 63), (1 << 64) - 1))))
        elif wire == 1:
            parts.append(varint(number << 3 | 1) + draw(st.binary(min_size=8, max_size=8)))
        elif wire == 5:
            parts.append(varint(number << 3 | 5) + draw(st.binary(min_size=4, max_size=4)))
        elif depth > 0 and draw(st.booleans()):
            parts.append(ln(number, draw(_field_soup(depth - 1))))
        else:
            parts.append(ln(number, draw(st.binary(max_size=12))))
    if draw(st.integers(0, 9)) == 0:  # now and then, a broken tail
        parts.append(draw(st.binary(max_size=4)))
    return b"".join(parts)


_ALL_KINDS = sorted(KINDS) + [("v1", kind) for kind in ANY_VERSION_KINDS]


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_an_api_error(data: bytes) -> None:
    for body in (data, MAGIC + data):
        try:
            json.dumps(decode(body))
        except ApiError as exc:
            assert exc.code in (400, 415)


@settings(max_examples=400)
@given(st.sampled_from(_ALL_KINDS), _field_soup())
def test_random_objects_of_every_kind_decode_or_raise_an_api_error(kind: tuple[str, str], raw: bytes) -> None:
    try:
        obj = decode(envelope(*kind, raw))
    except ApiError as exc:
        assert exc.code == 400
    else:
        assert (obj["apiVersion"], obj["kind"]) == kind
        json.dumps(obj)
