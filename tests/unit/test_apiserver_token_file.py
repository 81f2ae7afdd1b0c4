"""kube's --token-auth-file format: parsed strictly, refused whole on any bad line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.token_file import StaticUser, TokenFileError, find_user, load_token_file, parse_token_file

TOKEN = "a" * 16


def test_lines_give_users_with_their_groups() -> None:
    text = f'# nodes\n\n{TOKEN},system:node:n1,u1,"system:nodes, extra"\n{"b" * 20},ctrl,,\n'
    users = parse_token_file(text)
    assert users[TOKEN] == StaticUser("system:node:n1", "u1", ("system:nodes", "extra"))
    assert users["b" * 20] == StaticUser("ctrl", "", ())
    assert find_user(users, TOKEN) == users[TOKEN]
    assert find_user(users, TOKEN + "x") is None
    assert find_user(users, "") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("short,user,uid\n", "line 1: the token is shorter"),
        (f"{TOKEN},,uid\n", "line 1: the user is empty"),
        (f"{TOKEN},user\n", "line 1: expected token,user,uid"),
        (f"{TOKEN},a,1\n{TOKEN},b,2\n", "line 2: the token appears twice"),
    ],
)
def test_a_bad_line_refuses_the_file(text: str, message: str) -> None:
    with pytest.raises(TokenFileError, match=message):
        parse_token_file(text)


def test_a_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text(f"{TOKEN},user,uid\n")
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match="readable by others"):
        load_token_file(path)
    path.chmod(0o600)
    assert list(load_token_file(path).values()) == [StaticUser("user", "uid", ())]
    with pytest.raises(TokenFileError, match="cannot open"):
        load_token_file(tmp_path / "missing.csv")


@given(st.text())
def test_any_text_parses_or_is_refused_with_a_clear_error(text: str) -> None:
    try:
        users = parse_token_file(text)
    except TokenFileError:
        return
    assert all(len(token) >= 16 and user.username for token, user in users.items())


# -- the Node authorizer's graph: a pod's references, from any shape ------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_references_of_any_pod_shape_never_raise(spec: object) -> None:
    from ambit.apiserver.node_authorizer import references

    assert all(kind in ("secret", "configmap", "claim") for kind, _ in references({"spec": spec}))


def test_references_cover_volumes_projections_env_and_pull_secrets() -> None:
    from ambit.apiserver.node_authorizer import references

    spec = {
        "imagePullSecrets": [{"name": "pull"}],
        "volumes": [
            {"name": "a", "secret": {"secretName": "vol-secret"}},
            {"name": "b", "configMap": {"name": "vol-cm"}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "claim"}},
            {
                "name": "d",
                "projected": {"sources": [{"secret": {"name": "p-secret"}}, {"configMap": {"name": "p-cm"}}]},
            },
        ],
        "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
        "containers": [
            {
                "name": "c",
                "envFrom": [{"configMapRef": {"name": "from-cm"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
            }
        ],
    }
    assert set(references({"spec": spec})) == {
        ("configmap", "kube-root-ca.crt"),
        ("secret", "pull"),
        ("secret", "vol-secret"),
        ("configmap", "vol-cm"),
        ("claim", "claim"),
        ("secret", "p-secret"),
        ("configmap", "p-cm"),
        ("secret", "init-secret"),
        ("configmap", "from-cm"),
        ("secret", "env-secret"),
    }


def test_a_pod_that_does_not_mount_its_token_does_not_reach_the_root_ca_config_map() -> None:
    from ambit.apiserver.node_authorizer import references

    assert list(references({"spec": {"automountServiceAccountToken": False}})) == []
