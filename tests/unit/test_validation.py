from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_objects, json_values

from ambit.apiserver.errors import invalid as invalid_error
from ambit.apiserver.names import (
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    label_value,
    path_segment,
    qualified_name,
)
from ambit.apiserver.validation import SPEC_RULES, generate_name, validate_object


def fields(causes: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in causes]


def one(causes: list[tuple[str, str]]) -> tuple[str, str]:
    assert len(causes) == 1, causes
    return causes[0]


# ---- grammars --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "demo", "my-app-1", "123-abc", "a" * 63])
def test_good_dns1123_labels(name: str) -> None:
    assert dns1123_label(name) == []


@pytest.mark.parametrize("name", ["", "-a", "a-", "Demo", "a.b", "a_b", "a" * 64, "ä"])
def test_bad_dns1123_labels(name: str) -> None:
    assert dns1123_label(name)


def test_subdomains_allow_dots_and_253_characters() -> None:
    assert dns1123_subdomain("web.v1.example") == []
    assert dns1123_subdomain(".".join(["a" * 63] * 4)[:253]) == []
    assert dns1123_subdomain("a" * 254) == ["must be no more than 253 characters"]
    assert dns1123_subdomain("a..b")
    assert dns1123_subdomain("UPPER")


def test_dns1035_labels_start_with_a_letter() -> None:
    assert dns1035_label("web") == []
    assert dns1035_label("1web")
    assert dns1123_label("1web") == []


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("app", True),
        ("App_Name.v2", True),
        ("app.kubernetes.io/name", True),
        ("istio.io/dataplane-mode", True),
        ("/name", False),
        ("example.com/", False),
        ("a/b/c", False),
        ("Example.com/name", False),
        ("-app", False),
        ("a" * 64, False),
    ],
)
def test_qualified_names(key: str, ok: bool) -> None:
    assert (qualified_name(key) == []) is ok


def test_label_values_may_be_empty_but_not_long_or_odd() -> None:
    assert label_value("") == []
    assert label_value("v1.2_3-x") == []
    assert label_value("a" * 64)
    assert label_value("has space")


def test_path_segments_refuse_dots_and_slashes() -> None:
    assert path_segment("system:controller:attachdetach") == []
    assert path_segment("..")
    assert path_segment("a/b") == ["may not contain '/'"]


# ---- generateName ----------------------------------------------------------------------------------------


def test_generate_name_appends_the_suffix() -> None:
    assert generate_name("web-", "x7k2q") == "web-x7k2q"


def test_generate_name_cuts_long_prefixes_to_fit_63() -> None:
    name = generate_name("p" * 100, "abcde")
    assert name == "p" * 58 + "abcde"
    assert len(name) == 63


# ---- metadata --------------------------------------------------------------------------------------------


def cm(**metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", **metadata}}


def test_a_plain_object_is_valid() -> None:
    assert validate_object("ConfigMap", "", cm(namespace="demo", labels={"app": "web"})) == []


def test_server_filled_metadata_is_accepted() -> None:
    obj = cm(uid="3f1c", resourceVersion="12", creationTimestamp=None, managedFields=[{"manager": "kubectl"}])
    assert validate_object("ConfigMap", "", obj) == []


def test_name_is_required_and_reported_like_kube() -> None:
    assert one(validate_object("ConfigMap", "", {"metadata": {}})) == (
        "metadata.name",
        "Required value: name or generateName is required",
    )
    assert fields(validate_object("ConfigMap", "", {})) == ["metadata.name"]


def test_invalid_name_message_quotes_the_value() -> None:
    field, message = one(validate_object("ConfigMap", "", cm(name="Bad_Name")))
    assert field == "metadata.name"
    assert message.startswith('Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain')


@pytest.mark.parametrize(
    ("kind", "group", "name", "ok"),
    [
        ("Namespace", "", "demo", True),
        ("Namespace", "", "demo.v1", False),
        ("Service", "", "web", True),
        ("Service", "", "1web", False),
        ("Service", "", "web.v1", False),
        ("Pod", "", "web.v1", True),
        ("Pod", "", "1web", True),
        ("ServiceAccount", "", "front.end", True),
        ("ClusterRole", "rbac.authorization.k8s.io", "system:controller:x", True),
        ("ServiceEntry", "networking.istio.io", "external.api", True),
        ("ServiceEntry", "networking.istio.io", "External", False),
    ],
)
def test_each_kind_has_its_name_rule(kind: str, group: str, name: str, ok: bool) -> None:
    obj = {"metadata": {"name": name}, "spec": {"containers": [{"name": "a", "image": "i"}], "ports": [{"port": 80}]}}
    assert ("metadata.name" not in fields(validate_object(kind, group, obj))) is ok


def test_review_requests_need_no_name() -> None:
    assert validate_object("SelfSubjectAccessReview", "authorization.k8s.io", {"spec": {}}) == []


def test_namespace_must_be_a_label() -> None:
    assert fields(validate_object("ConfigMap", "", cm(namespace="Demo"))) == ["metadata.namespace"]


def test_garbage_shaped_metadata_is_a_cause() -> None:
    assert one(validate_object("ConfigMap", "", {"metadata": ["x"]}))[0] == "metadata"
    assert fields(validate_object("ConfigMap", "", cm(labels=["a"]))) == ["metadata.labels"]
    assert fields(validate_object("ConfigMap", "", cm(labels={"app": 3}))) == ["metadata.labels[app]"]
    assert fields(validate_object("ConfigMap", "", cm(annotations="x"))) == ["metadata.annotations"]
    assert fields(validate_object("ConfigMap", "", cm(name=7))) == ["metadata.name"]
    assert one(validate_object("ConfigMap", "", "not an object"))[0] == ""


def test_bad_label_keys_and_values() -> None:
    causes = validate_object("ConfigMap", "", cm(labels={"-bad": "ok", "good": "not ok!"}))
    assert fields(causes) == ["metadata.labels", "metadata.labels[good]"]


def test_annotations_may_total_256_kib() -> None:
    big = "x" * (256 * 1024 - 10)
    assert validate_object("ConfigMap", "", cm(annotations={"a": big})) == []
    field, message = one(validate_object("ConfigMap", "", cm(annotations={"a": big, "b": "y" * 20})))
    assert (field, message) == ("metadata.annotations", "Too long: must have at most 262144 bytes")


def test_annotation_keys_may_use_capitals() -> None:
    assert validate_object("ConfigMap", "", cm(annotations={"Example.com/Owner": "x"})) == []


def test_finalizers_and_owner_references() -> None:
    assert validate_object("ConfigMap", "", cm(finalizers=["example.com/cleanup", "orphan"])) == []
    assert fields(validate_object("ConfigMap", "", cm(finalizers=["a", "a", 3]))) == [
        "metadata.finalizers[1]",
        "metadata.finalizers[2]",
    ]
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "1", "controller": True}
    assert validate_object("ConfigMap", "", cm(ownerReferences=[ref])) == []
    assert fields(validate_object("ConfigMap", "", cm(ownerReferences=[ref, ref, {"kind": "X"}]))) == [
        "metadata.ownerReferences[2].apiVersion",
        "metadata.ownerReferences[2].name",
        "metadata.ownerReferences[2].uid",
        "metadata.ownerReferences",
    ]


def test_causes_fit_the_invalid_error() -> None:
    causes = validate_object("Service", "", {"metadata": {"name": "Web"}, "spec": {"ports": [{"port": 0}]}})
    error = invalid_error("Service", "Web", causes)
    assert error.code == 422
    assert "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive" in error.message


# ---- pods and workloads ----------------------------------------------------------------------------------


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web"}, "spec": {"containers": list(containers), **spec}}


APP = {"name": "app", "image": "python:3.12", "ports": [{"containerPort": 8080, "name": "http"}]}


def test_valid_pod() -> None:
    sidecar = {"name": "mesh", "image": "proxy", "restartPolicy": "Always"}
    env = [{"name": "BACKEND_URL", "value": "http://backend"}, {"name": "X", "valueFrom": {}}]
    assert validate_object("Pod", "", pod({**APP, "env": env}, initContainers=[sidecar], restartPolicy="Never")) == []


def test_pod_needs_containers() -> None:
    assert one(validate_object("Pod", "", pod())) == ("spec.containers", "Required value")
    assert fields(validate_object("Pod", "", {"metadata": {"name": "p"}})) == ["spec"]
    assert fields(validate_object("Pod", "", {"metadata": {"name": "p"}, "spec": {"containers": "app"}})) == [
        "spec.containers"
    ]


@pytest.mark.parametrize(
    ("profile", "cause"),
    [
        ({"type": "RuntimeDefault"}, None),
        ({"type": "Unconfined"}, None),
        ({"type": "Localhost", "localhostProfile": "profiles/audit.json"}, None),
        ({}, ("type", "Required value: type is required when seccompProfile is set")),
        (
            {"type": "Permissive"},
            ("type", 'Unsupported value: "Permissive": supported values: "Localhost", "RuntimeDefault", "Unconfined"'),
        ),
        ({"type": "Localhost"}, ("localhostProfile", "Required value: must be set when seccomp type is Localhost")),
        (
            {"type": "Localhost", "localhostProfile": "/etc/x.json"},
            ("localhostProfile", 'Invalid value: "/etc/x.json": must be a relative path'),
        ),
        (
            {"type": "Localhost", "localhostProfile": "a/../../x.json"},
            ("localhostProfile", "Invalid value: \"a/../../x.json\": must not contain '..'"),
        ),
        (
            {"type": "RuntimeDefault", "localhostProfile": "x.json"},
            ("localhostProfile", 'Invalid value: "x.json": can only be set when seccomp type is Localhost'),
        ),
    ],
)
def test_seccomp_profiles_of_pods_and_containers_are_validated_as_kube_does(
    profile: dict[str, Any], cause: tuple[str, str] | None
) -> None:
    on_pod = validate_object("Pod", "", pod(APP, securityContext={"seccompProfile": profile}))
    on_container = validate_object("Pod", "", pod({**APP, "securityContext": {"seccompProfile": profile}}))
    if cause is None:
        assert on_pod == on_container == []
        return
    field, message = cause
    assert on_pod == [(f"spec.securityContext.seccompProfile.{field}", message)]
    assert on_container == [(f"spec.containers[0].securityContext.seccompProfile.{field}", message)]


def test_host_users_false_is_forbidden_with_host_namespaces() -> None:
    assert validate_object("Pod", "", pod(APP, hostUsers=False)) == []
    assert validate_object("Pod", "", pod(APP, hostUsers=True, hostNetwork=True, hostPID=True)) == []
    causes = validate_object("Pod", "", pod(APP, hostUsers=False, hostNetwork=True, hostPID=True, hostIPC=True))
    assert causes == [
        ("spec.hostNetwork", "Forbidden: when `pod.Spec.HostUsers` is false"),
        ("spec.HostPID", "Forbidden: when `pod.Spec.HostUsers` is false"),
        ("spec.HostIPC", "Forbidden: when `pod.Spec.HostUsers` is false"),
    ]


def test_container_names_are_unique_labels_and_images_are_required() -> None:
    causes = validate_object("Pod", "", pod(APP, {"name": "app", "image": "x"}, {"name": "Side_Car"}, {}))
    assert fields(causes) == [
        "spec.containers[1].name",
        "spec.containers[2].name",
        "spec.containers[2].image",
        "spec.containers[3].name",
        "spec.containers[3].image",
    ]
    assert causes[0][1] == 'Duplicate value: "app"'


def test_init_container_names_clash_with_app_container_names() -> None:
    causes = validate_object("Pod", "", pod(APP, initContainers=[{"name": "app", "image": "x"}]))
    assert fields(causes) == ["spec.containers[0].name"]


def test_container_ports_env_and_restart_policy() -> None:
    bad = {
        "name": "app",
        "image": "x",
        "ports": [{"containerPort": 70000}, {"containerPort": 80, "protocol": "HTTP", "name": "Web--x"}],
        "env": [{"name": "1ABC"}, {"value": "x"}],
        "restartPolicy": "Always",
    }
    causes = validate_object("Pod", "", pod(bad, restartPolicy="Sometimes"))
    assert fields(causes) == [
        "spec.containers[0].ports[0].containerPort",
        "spec.containers[0].ports[1].protocol",
        "spec.containers[0].ports[1].name",
        "spec.containers[0].ports[1].name",
        "spec.containers[0].env[0].name",
        "spec.containers[0].env[1].name",
        "spec.containers[0].restartPolicy",
        "spec.restartPolicy",
    ]
    assert causes[1][1] == 'Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP"'


def deployment(selector: Any, labels: Any, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": selector,
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [APP]}},
            **spec,
        },
    }


def test_valid_deployment() -> None:
    selector = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}
    assert validate_object("Deployment", "apps", deployment(selector, {"app": "web", "tier": "a"})) == []


def test_selector_must_match_template_labels() -> None:
    causes = validate_object("Deployment", "apps", deployment({"matchLabels": {"app": "web"}}, {"app": "api"}))
    field, message = one(causes)
    assert field == "spec.template.metadata.labels"
    assert message.endswith("`selector` does not match template `labels`")
    expression = {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}
    assert fields(validate_object("ReplicaSet", "apps", deployment(expression, {"tier": "a"}))) == [
        "spec.template.metadata.labels"
    ]


def test_workloads_need_a_selector_a_template_and_sane_replicas() -> None:
    causes = validate_object("Deployment", "apps", deployment(None, {"app": "web"}, replicas=-1))
    assert fields(causes) == ["spec.replicas", "spec.selector"]
    assert fields(validate_object("DaemonSet", "apps", deployment({}, {"app": "web"}))) == ["spec.selector"]
    assert fields(validate_object("StatefulSet", "apps", {"metadata": {"name": "db"}, "spec": {}})) == [
        "spec.selector",
        "spec.template",
    ]


def test_workload_pods_must_restart_always() -> None:
    obj = deployment({"matchLabels": {"app": "web"}}, {"app": "web"})
    obj["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert fields(validate_object("Deployment", "apps", obj)) == ["spec.template.spec.restartPolicy"]


def test_bad_selector_expressions() -> None:
    selector = {"matchExpressions": [{"key": "a", "operator": "Near"}, {"key": "b", "operator": "In"}]}
    causes = validate_object("Deployment", "apps", deployment(selector, {"a": "x"}))
    assert "spec.selector.matchExpressions[0].operator" in fields(causes)
    assert "spec.selector.matchExpressions[1].values" in fields(causes)


# ---- services --------------------------------------------------------------------------------------------


def svc(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web"}, "spec": spec}


def test_valid_services() -> None:
    ports = [{"name": "http", "port": 80, "targetPort": "http"}, {"name": "dns", "port": 53, "protocol": "UDP"}]
    assert validate_object("Service", "", svc(selector={"app": "web"}, ports=ports)) == []
    assert validate_object("Service", "", svc(type="NodePort", ports=[{"port": 80, "nodePort": 30080}])) == []
    assert validate_object("Service", "", svc(type="ExternalName", externalName="db.example.com.")) == []
    assert validate_object("Service", "", svc(clusterIP="None", selector={"app": "db"})) == []
    assert validate_object("Service", "", svc(clusterIP="10.96.0.10", ports=[{"port": 443, "targetPort": 8443}])) == []


def test_service_port_rules() -> None:
    ports = [
        {"port": 70000},
        {"port": 80, "protocol": "HTTP"},
        {"name": "web", "port": 81, "nodePort": 30001},
        {"name": "web", "port": 82, "targetPort": "Not_A_Name"},
    ]
    causes = validate_object("Service", "", svc(ports=ports))
    assert fields(causes) == [
        "spec.ports[0].port",
        "spec.ports[0].name",
        "spec.ports[1].protocol",
        "spec.ports[1].name",
        "spec.ports[2].nodePort",
        "spec.ports[3].name",
        "spec.ports[3].targetPort",
    ]
    assert causes[4][1] == "Forbidden: may not be used when `type` is 'ClusterIP'"


def test_service_type_ports_and_external_name() -> None:
    assert fields(validate_object("Service", "", svc(type="Ingress", ports=[{"port": 80}]))) == ["spec.type"]
    assert one(validate_object("Service", "", svc()))[0] == "spec.ports"
    assert fields(validate_object("Service", "", svc(type="ExternalName"))) == ["spec.externalName"]
    assert fields(validate_object("Service", "", svc(type="ExternalName", externalName="Not A Host"))) == [
        "spec.externalName"
    ]
    assert fields(validate_object("Service", "", svc(clusterIP="10.96.0.300", ports=[{"port": 80}]))) == [
        "spec.clusterIP"
    ]
    duplicate_ports = [{"name": "a", "port": 80}, {"name": "b", "port": 80}]
    assert fields(validate_object("Service", "", svc(ports=duplicate_ports))) == ["spec.ports[1]"]


# ---- config maps and secrets -----------------------------------------------------------------------------


def test_config_map_keys() -> None:
    good = {"metadata": {"name": "cm"}, "data": {"app.conf": "x", "KEY_1": "y", "-x": ""}, "binaryData": {"b": "AAE="}}
    assert validate_object("ConfigMap", "", good) == []
    bad = {"metadata": {"name": "cm"}, "data": {"a/b": "x", "..": "y", "n": 3}, "binaryData": {"n": "%%", "b": "AA=="}}
    assert fields(validate_object("ConfigMap", "", bad)) == [
        "data",
        "data",
        "data.n",
        "binaryData.n",
    ]


def test_config_map_data_and_binary_data_may_not_share_keys() -> None:
    obj = {"metadata": {"name": "cm"}, "data": {"k": "x"}, "binaryData": {"k": "AA=="}}
    assert one(validate_object("ConfigMap", "", obj)) == ("binaryData.k", 'Duplicate value: "k"')


def test_config_map_holds_at_most_one_mebibyte() -> None:
    obj = {"metadata": {"name": "cm"}, "data": {"a": "x" * (1024 * 1024), "b": "y"}}
    assert one(validate_object("ConfigMap", "", obj)) == ("data", "Too long: must have at most 1048576 bytes")


def test_secret_values_are_base64() -> None:
    good = {"metadata": {"name": "s"}, "data": {"password": "aHVudGVyMg==", "empty": ""}, "stringData": {"u": "me"}}
    assert validate_object("Secret", "", good) == []
    bad = {"metadata": {"name": "s"}, "data": {"password": "hunter2!"}}
    field, message = one(validate_object("Secret", "", bad))
    assert field == "data.password"
    assert "hunter2" not in message  # secret values stay out of error messages


def test_typed_secrets_need_their_keys() -> None:
    tls = {"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": {"tls.crt": ""}}
    assert fields(validate_object("Secret", "", tls)) == ["data.tls.key"]
    tls["stringData"] = {"tls.key": "k"}
    assert validate_object("Secret", "", tls) == []
    token = {"metadata": {"name": "t"}, "type": "kubernetes.io/service-account-token"}
    assert fields(validate_object("Secret", "", token)) == ["metadata.annotations[kubernetes.io/service-account.name]"]


# ---- endpoint slices and CRDs ----------------------------------------------------------------------------


def test_endpoint_slices() -> None:
    good = {
        "metadata": {"name": "web-x1"},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.1"]}],
        "ports": [{"name": "http", "port": 8080}, {"name": ""}],
    }
    assert validate_object("EndpointSlice", "discovery.k8s.io", good) == []
    bad = {"metadata": {"name": "web-x1"}, "addressType": "IPX", "endpoints": [{"addresses": []}]}
    assert fields(validate_object("EndpointSlice", "discovery.k8s.io", bad)) == [
        "addressType",
        "endpoints[0].addresses",
    ]


def crd(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                    "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                },
                {"name": "v1beta1", "served": True, "storage": False, "schema": {"openAPIV3Schema": {}}},
            ],
        },
    }
    obj["spec"].update(overrides)
    return obj


def test_valid_crd() -> None:
    assert validate_object("CustomResourceDefinition", "apiextensions.k8s.io", crd()) == []


def test_crd_name_must_be_plural_dot_group() -> None:
    obj = crd(group="other.example.com")
    assert one(validate_object("CustomResourceDefinition", "apiextensions.k8s.io", obj))[0] == "metadata.name"


def test_crd_needs_exactly_one_storage_version() -> None:
    obj = crd()
    obj["spec"]["versions"][1]["storage"] = True
    field, message = one(validate_object("CustomResourceDefinition", "apiextensions.k8s.io", obj))
    assert field == "spec.versions"
    assert message.endswith("must have exactly one version marked as storage version")


def test_crd_printer_columns_must_be_evaluable() -> None:
    obj = crd()
    obj["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "A", "type": "text", "jsonPath": ".spec.a"},
        {"name": "B", "type": "string", "jsonPath": ".spec..b"},
    ]
    assert fields(validate_object("CustomResourceDefinition", "apiextensions.k8s.io", obj)) == [
        "spec.versions[0].additionalPrinterColumns[0].type",
        "spec.versions[0].additionalPrinterColumns[1].jsonPath",
    ]


def test_crd_names_scope_and_group() -> None:
    obj = crd(group="example", scope="Global", names={"plural": "Widgets", "kind": "widget kind"})
    obj["metadata"]["name"] = "Widgets.example"
    assert fields(validate_object("CustomResourceDefinition", "apiextensions.k8s.io", obj)) == [
        "metadata.name",
        "spec.group",
        "spec.names.plural",
        "spec.names.kind",
        "spec.scope",
    ]


# ---- never raises ----------------------------------------------------------------------------------------

KINDS = sorted({*SPEC_RULES, ("", "Namespace"), ("security.istio.io", "AuthorizationPolicy")})


@settings(max_examples=500, deadline=None)
@given(key=st.sampled_from(KINDS), obj=json_values())
def test_validate_object_never_raises_on_any_json(key: tuple[str, str], obj: Any) -> None:
    group, kind = key
    causes = validate_object(kind, group, obj)
    assert all(isinstance(f, str) and isinstance(m, str) for f, m in causes)


@settings(max_examples=500, deadline=None)
@given(key=st.sampled_from(KINDS), obj=json_objects())
def test_validate_object_never_raises_on_object_shaped_json(key: tuple[str, str], obj: dict[str, Any]) -> None:
    group, kind = key
    before = copy.deepcopy(obj)
    causes = validate_object(kind, group, obj)
    assert all(isinstance(f, str) and isinstance(m, str) for f, m in causes)
    assert obj == before  # validation never changes what it looks at
