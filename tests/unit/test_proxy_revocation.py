"""The node proxy's CRL bookkeeping (ambit.proxy.revocation): the file's states, admission, tracking, teardown,
counters and the ``/config_dump`` section. The handshakes themselves are in tests/integration/test_hbone_crl.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests import crl_pki

from ambit.model.identity import SpiffeId
from ambit.proxy.revocation import PeerRevokedError, RevocationManager
from ambit.telemetry.metrics import ProxyMetrics, Reporter

ROOT = crl_pki.root()
INTER = crl_pki.intermediate(ROOT)
ALICE = crl_pki.workload(INTER, SpiffeId("cluster.local", "ns", "alice"))
BOB = crl_pki.workload(INTER, SpiffeId("cluster.local", "ns", "bob"))
ALICE_CHAIN, BOB_CHAIN = crl_pki.der_chain(ALICE), crl_pki.der_chain(BOB)
REVOKE_ALICE = crl_pki.crl(INTER, [crl_pki.serial_of(ALICE.chain_pem[0])])


def counted(metrics: ProxyMetrics, name: str, reporter: str) -> float:
    found = re.search(rf'^{name}{{reporter="{reporter}"}} (\S+)$', metrics.render().decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def manager(tmp_path: Path) -> tuple[RevocationManager, ProxyMetrics, Path]:
    metrics = ProxyMetrics()
    path = tmp_path / "crl" / "ca-crl.pem"
    path.parent.mkdir()
    return RevocationManager(path, metrics, anchors=lambda: [ROOT.cert_pem], wall_clock=lambda: 1e9), metrics, path


def write(path: Path, data: bytes) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_bytes(data)
    staged.replace(path)


def test_a_missing_file_means_no_checks_and_no_error(tmp_path: Path) -> None:
    crls, _, _ = manager(tmp_path)
    assert not crls.poll()
    crls.admit(ALICE_CHAIN, Reporter.DESTINATION, "alice", lambda _: None)
    assert crls.to_dump() == {
        "path": str(tmp_path / "crl" / "ca-crl.pem"),
        "loaded": False,
        "loadedAt": "",
        "error": "",
        "ignored": [],
        "crls": [],
        "trackedConnections": 1,
    }


def test_a_revoked_chain_is_refused_and_counted_and_others_are_tracked_until_released(tmp_path: Path) -> None:
    crls, metrics, path = manager(tmp_path)
    write(path, REVOKE_ALICE)
    assert crls.poll()
    with pytest.raises(PeerRevokedError, match=r"alice.*leaf with serial"):
        crls.admit(ALICE_CHAIN, Reporter.DESTINATION, "alice", lambda _: None)
    assert counted(metrics, "istio_crl_policy_rejections_total", "destination") == 1
    tracked = crls.admit(BOB_CHAIN, Reporter.SOURCE, "bob", lambda _: None)
    assert crls.tracked == 1
    tracked.release()
    tracked.release()
    assert crls.tracked == 0
    dump = crls.to_dump()
    assert dump["loaded"] is True and dump["loadedAt"] == "2001-09-09T01:46:40+00:00"
    assert dump["crls"][0]["revokedCertificates"] == 1
    assert dump["crls"][0]["issuer"] == "CN=Plug-in intermediate"


def test_a_new_crl_closes_exactly_the_connections_it_revokes(tmp_path: Path) -> None:
    crls, metrics, path = manager(tmp_path)
    closed: list[tuple[str, str]] = []
    crls.admit(ALICE_CHAIN, Reporter.SOURCE, "alice", lambda why: closed.append(("alice", why)))
    crls.admit(BOB_CHAIN, Reporter.SOURCE, "bob", lambda why: closed.append(("bob", why)))
    write(path, REVOKE_ALICE)
    assert crls.poll()
    assert [who for who, _ in closed] == ["alice"]
    assert "peer certificate revoked" in closed[0][1]
    assert crls.tracked == 1
    assert counted(metrics, "istio_crl_policy_rejections_total", "source") == 1
    write(path, crl_pki.crl(ROOT, [crl_pki.serial_of(INTER.cert_pem)]))
    assert crls.poll()
    assert [who for who, _ in closed] == ["alice", "bob"]


def test_a_connection_without_a_chain_is_admitted_untracked_and_counted(tmp_path: Path) -> None:
    crls, metrics, path = manager(tmp_path)
    write(path, REVOKE_ALICE)
    crls.poll()
    crls.admit(None, Reporter.SOURCE, "someone", lambda _: None).release()
    assert crls.tracked == 0
    assert counted(metrics, "istio_crl_untracked_connections_total", "source") == 1


def test_an_unreadable_peer_chain_is_refused_while_crls_are_loaded(tmp_path: Path) -> None:
    crls, _, path = manager(tmp_path)
    write(path, REVOKE_ALICE)
    crls.poll()
    with pytest.raises(PeerRevokedError, match="cannot be read"):
        crls.admit([b"\x30\x00", ALICE_CHAIN[-1]], Reporter.DESTINATION, "garbled", lambda _: None)


def test_bad_and_vanished_files_keep_the_last_crl_and_say_so(tmp_path: Path) -> None:
    crls, _, path = manager(tmp_path)
    write(path, REVOKE_ALICE)
    assert crls.poll()
    write(path, b"junk")
    assert not crls.poll()
    assert "neither PEM" in crls.error and "last CRL stays in force" in crls.error
    assert crls.to_dump()["error"] == crls.error
    with pytest.raises(PeerRevokedError):
        crls.admit(ALICE_CHAIN, Reporter.DESTINATION, "alice", lambda _: None)
    path.unlink()
    assert not crls.poll()
    assert "gone" in crls.error
    write(path, REVOKE_ALICE)  # the same content back: nothing to re-judge, the error clears
    assert not crls.poll()
    assert crls.error == ""


def test_an_unreadable_anchor_file_does_not_stop_the_crl_loading(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    path = tmp_path / "ca-crl.pem"
    write(path, REVOKE_ALICE)

    def anchors() -> list[bytes]:
        raise FileNotFoundError("root-cert.pem")

    crls = RevocationManager(path, metrics, anchors=anchors)
    assert crls.poll()
    assert crls.to_dump()["crls"][0]["status"] == "unverified"


def test_connections_to_one_peer_share_one_copy_of_its_chain(tmp_path: Path) -> None:
    crls, _, _ = manager(tmp_path)
    copies = [[bytes(bytearray(der)) for der in ALICE_CHAIN] for _ in range(3)]
    for chain in copies:
        crls.admit(chain, Reporter.SOURCE, "alice", lambda _: None)
    held = [conn.chain for conn in crls._connections.values()]
    assert all(a is b for a, b in zip(held[0], held[2], strict=True))


CRL_PATH_WITHOUT_A_FILE = """
import sys
from pathlib import Path
from ambit.proxy.revocation import RevocationManager
from ambit.telemetry.metrics import ProxyMetrics, Reporter
crls = RevocationManager(Path(sys.argv[1]), ProxyMetrics())
assert crls.poll() is False
crls.admit([b"leaf", b"root"], Reporter.DESTINATION, "peer", lambda reason: None).release()
dump = crls.to_dump()
assert dump["crls"] == [] and dump["ignored"] == [] and dump["loaded"] is False, dump
print(sorted(name for name in sys.modules if name.split(".")[0] == "cryptography"))
"""


def test_a_crl_path_whose_file_is_missing_checks_nothing_and_does_not_load_cryptography(tmp_path: Path) -> None:
    """The deployed node proxy has a CRL path whose file appears only once the CA publishes a CRL: until then it must
    not pay for cryptography's X.509 stack (about 10 MiB per process, issue 23)."""
    done = subprocess.run(
        [sys.executable, "-c", CRL_PATH_WITHOUT_A_FILE, str(tmp_path / "ca-crl.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
