"""The plug-in CA reload decision (old CA + new files -> new CA or a refusal with its reason), the attacks on it, the
signer swap, and the watcher's handling of files written one by one or swapped while it reads."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from tests import crl_pki
from tests.cacerts import cacerts_files, first_cert, write_plain, write_volume

from ambit.controlplane.ca.cawatch import CaPaths, PluginCaWatcher
from ambit.controlplane.ca.rootca import RootCa
from ambit.controlplane.ca.rotation import (
    CaEvent,
    CaFiles,
    PluginCaError,
    Refusal,
    judge_ca_files,
    plugin_ca_from_files,
)
from ambit.controlplane.ca.server import RootSigner, flatten_chain
from ambit.model.identity import SpiffeId
from ambit.tls.certs import KeyPair, issue_server_cert
from ambit.tls.spiffe import make_csr

NOW = crl_pki.NOW
WEB = SpiffeId("cluster.local", "shop", "web")

ROOT = crl_pki.root("Mesh root")
NEW_ROOT = crl_pki.root("New mesh root")
EVIL_ROOT = crl_pki.root("Mesh root")  # the same name as the real root, another key
FIRST = crl_pki.intermediate(ROOT, "Intermediate 1")
SECOND = crl_pki.intermediate(ROOT, "Intermediate 2")
UNDER_NEW_ROOT = crl_pki.intermediate(NEW_ROOT, "Intermediate under the new root")
EVIL = crl_pki.intermediate(EVIL_ROOT, "Intermediate 2")


def files(signer: KeyPair, roots: bytes = ROOT.cert_pem, **override: bytes | None) -> CaFiles:
    written = cacerts_files(signer, roots)
    fields: dict[str, bytes | None] = {
        "cert": written["ca-cert.pem"],
        "key": written["ca-key.pem"],
        "chain": written["cert-chain.pem"],
        "root": written["root-cert.pem"],
    }
    fields.update(override)
    return CaFiles(**fields)


def in_use(signer: KeyPair = FIRST, roots: bytes = ROOT.cert_pem) -> RootCa:
    return plugin_ca_from_files(files(signer, roots), NOW)


def subject_of(pem: bytes) -> str:
    return x509.load_pem_x509_certificate(pem).subject.rfc4514_string()


# -- the decision ----------------------------------------------------------------------------------------------


def test_the_same_files_again_change_nothing() -> None:
    assert judge_ca_files(in_use(), files(FIRST), NOW).event is CaEvent.UNCHANGED


def test_a_new_intermediate_under_the_same_root_is_taken_and_the_bundle_stays() -> None:
    verdict = judge_ca_files(in_use(), files(SECOND), NOW)
    assert verdict.event is CaEvent.RELOAD and verdict.ca is not None
    assert first_cert(verdict.ca.signer.cert_pem) == first_cert(SECOND.cert_pem)
    assert verdict.ca.signer.key_pem == SECOND.key_pem
    assert verdict.ca.root_pem == ROOT.cert_pem
    assert "Intermediate 2" in verdict.message


def test_the_signer_presented_holds_the_intermediates_but_not_the_root() -> None:
    ca = in_use()
    assert [subject_of(c.public_bytes(serialization.Encoding.PEM)) for c in _certs(ca.signer.cert_pem)] == [
        "CN=Intermediate 1"
    ]


def test_a_root_rotation_goes_through_in_three_steps() -> None:
    both = ROOT.cert_pem + NEW_ROOT.cert_pem
    step1 = judge_ca_files(in_use(), files(FIRST, both), NOW)  # 1: trust the new root too
    assert step1.event is CaEvent.RELOAD and step1.ca is not None and step1.ca.root_pem == both
    step2 = judge_ca_files(step1.ca, files(UNDER_NEW_ROOT, both), NOW)  # 2: sign under the new root
    assert step2.event is CaEvent.RELOAD and step2.ca is not None
    assert first_cert(step2.ca.signer.cert_pem) == first_cert(UNDER_NEW_ROOT.cert_pem)
    step3 = judge_ca_files(step2.ca, files(UNDER_NEW_ROOT, NEW_ROOT.cert_pem), NOW)  # 3: drop the old root
    assert step3.event is CaEvent.RELOAD and step3.ca is not None and step3.ca.root_pem == NEW_ROOT.cert_pem


def test_a_root_replaced_in_one_step_is_refused() -> None:
    verdict = judge_ca_files(in_use(), files(UNDER_NEW_ROOT, NEW_ROOT.cert_pem), NOW)
    assert verdict.event is CaEvent.REFUSED and verdict.refusal is Refusal.ROOT_REPLACED
    assert "add the new root next to the old one first" in verdict.message


def test_the_root_defaults_to_the_last_certificate_of_the_chain() -> None:
    ca = plugin_ca_from_files(files(FIRST, root=None), NOW)
    assert ca.root_pem == first_cert(ROOT.cert_pem)


def test_a_not_yet_valid_ca_is_taken_as_its_makers_clock_may_be_ahead() -> None:
    assert plugin_ca_from_files(files(FIRST), NOW - 7 * 86400).signer.key_pem == FIRST.key_pem


# -- attacks and broken sets: refused with the rule they broke, the CA in use unchanged ---------------------------


def _expired() -> KeyPair:
    return crl_pki.intermediate(ROOT, "Old intermediate", now=NOW - 40 * 86400)


def _not_a_ca() -> KeyPair:
    server = issue_server_cert(FIRST, common_name="x", dns_names=["x"], ip_addresses=[], now=NOW)
    return KeyPair(cert_pem=server.cert_pem + FIRST.cert_pem, key_pem=server.key_pem)


@pytest.mark.parametrize(
    ("make", "refusal"),
    [
        # A key that is not the certificate's: the new cert with the old key (a half-updated Secret, or a swap).
        (lambda: files(SECOND, key=FIRST.key_pem), Refusal.KEY_MISMATCH),
        # An intermediate from a foreign root that carries the real root's name.
        (lambda: files(EVIL), Refusal.FOREIGN_ROOT),
        # ... with the foreign root also put in the chain file: still not a root of the bundle.
        (lambda: files(EVIL, chain=EVIL.cert_pem), Refusal.FOREIGN_ROOT),
        # ... and the bundle replaced by the foreign root: the roots in use would be dropped at once.
        (lambda: files(EVIL, EVIL_ROOT.cert_pem), Refusal.ROOT_REPLACED),
        # A certificate file cut short mid-write.
        (lambda: files(SECOND, cert=first_cert(SECOND.cert_pem)[:300]), Refusal.MALFORMED),
        (lambda: files(SECOND, key=SECOND.key_pem[:100]), Refusal.MALFORMED),
        (lambda: files(SECOND, root=ROOT.cert_pem[:-40]), Refusal.MALFORMED),
        (lambda: files(SECOND, cert=b""), Refusal.MALFORMED),
        (lambda: files(SECOND, key=None), Refusal.INCOMPLETE),
        (lambda: files(SECOND, cert=None, key=None), Refusal.INCOMPLETE),
        (lambda: files(_not_a_ca()), Refusal.NOT_A_CA),
        (lambda: files(_expired()), Refusal.EXPIRED),
        # A chain that does not reach the bundle: the intermediate alone, no chain file, the root somewhere else.
        (lambda: files(UNDER_NEW_ROOT, chain=None), Refusal.FOREIGN_ROOT),
    ],
)
def test_a_bad_set_is_refused_and_the_ca_in_use_stays(make: Callable[[], CaFiles], refusal: Refusal) -> None:
    current = in_use()
    verdict = judge_ca_files(current, make(), NOW)
    assert verdict.event is CaEvent.REFUSED, verdict
    assert verdict.refusal is refusal, verdict.message
    assert verdict.ca is None and verdict.message


def test_a_foreign_root_added_to_the_bundle_is_a_root_rotation_step_and_needs_the_files_writer() -> None:
    # Whoever can write the cacerts files is the CA's owner: adding a root is allowed (rotation step 1), but it must
    # keep the roots in use, and the signer must still chain to one of the bundle's roots.
    verdict = judge_ca_files(in_use(), files(FIRST, ROOT.cert_pem + EVIL_ROOT.cert_pem), NOW)
    assert verdict.event is CaEvent.RELOAD and verdict.ca is not None
    assert _der_set(verdict.ca.root_pem) >= _der_set(ROOT.cert_pem)


def test_an_expired_root_on_the_path_is_refused() -> None:
    old_root = crl_pki.root("Old root", now=NOW - 400 * 86400)
    signer = crl_pki.intermediate(old_root, now=NOW - 20 * 86400)
    with pytest.raises(PluginCaError) as caught:
        plugin_ca_from_files(files(signer, old_root.cert_pem), NOW)
    assert caught.value.refusal is Refusal.EXPIRED and "Old root" in str(caught.value)


def test_a_chain_that_loops_is_refused_not_followed_forever() -> None:
    a = crl_pki.intermediate(ROOT, "A")
    chain = b"".join([first_cert(a.cert_pem)] * 20)
    verdict = judge_ca_files(in_use(), files(a, chain=chain, root=NEW_ROOT.cert_pem + ROOT.cert_pem), NOW)
    assert verdict.event is CaEvent.RELOAD  # a reaches ROOT directly; the repeats are ignored
    lone = crl_pki.intermediate(EVIL_ROOT, "Lone")
    verdict = judge_ca_files(in_use(), files(lone, chain=first_cert(lone.cert_pem) * 20), NOW)
    assert verdict.refusal is Refusal.FOREIGN_ROOT


# -- signing after a reload ------------------------------------------------------------------------------------


def test_after_a_swap_new_certificates_chain_to_the_new_intermediate() -> None:
    signer = RootSigner(in_use(), clock=lambda: NOW)
    csr, _ = make_csr(WEB)
    before = flatten_chain(signer.sign(csr, WEB, 3600))
    verdict = judge_ca_files(signer.root, files(SECOND), NOW)
    assert verdict.ca is not None
    signer.set_root(verdict.ca)
    after = flatten_chain(signer.sign(csr, WEB, 3600))
    assert subject_of(before[1].encode()) == "CN=Intermediate 1"
    assert subject_of(after[1].encode()) == "CN=Intermediate 2"
    leaf = x509.load_pem_x509_certificate(after[0].encode())
    second = x509.load_pem_x509_certificate(after[1].encode())
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    ski = second.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert aki == ski  # what TestIntermediateCertificateRefresh checks
    leaf.verify_directly_issued_by(second)
    assert after[-1].encode() == first_cert(ROOT.cert_pem) and len(after) == 3


def test_during_a_root_rotation_the_answer_ends_with_both_roots_as_one_element() -> None:
    both = ROOT.cert_pem + NEW_ROOT.cert_pem
    signer = RootSigner(in_use(UNDER_NEW_ROOT, both), clock=lambda: NOW)
    csr, _ = make_csr(WEB)
    chain = flatten_chain(signer.sign(csr, WEB, 3600))
    assert len(chain) == 3
    assert [subject_of(c.public_bytes(serialization.Encoding.PEM)) for c in _certs(chain[-1].encode())] == [
        "CN=Mesh root,O=cluster.local",
        "CN=New mesh root,O=cluster.local",
    ]


def test_a_self_signed_plug_in_root_signs_directly_and_ends_the_chain_once() -> None:
    lab = plugin_ca_from_files(CaFiles(ROOT.cert_pem, ROOT.key_pem, ROOT.cert_pem, ROOT.cert_pem), NOW)
    csr, _ = make_csr(WEB)
    chain = flatten_chain(RootSigner(lab, clock=lambda: NOW).sign(csr, WEB, 3600))
    assert len(chain) == 2 and chain[1].encode() == first_cert(ROOT.cert_pem)


# -- the watcher: when a look is judged ------------------------------------------------------------------------


def _watcher(directory: Path, **kwargs: object) -> tuple[PluginCaWatcher, list[str], list[Refusal]]:
    reloads: list[str] = []
    refusals: list[Refusal] = []
    current = plugin_ca_from_files(_read(directory), NOW)
    watcher = PluginCaWatcher(
        CaPaths.in_directory(directory),
        current,
        on_reload=lambda ca, what: reloads.append(subject_of(ca.signer.cert_pem)),
        on_refused=lambda refusal, message: refusals.append(refusal),
        clock=lambda: NOW,
        **kwargs,  # type: ignore[arg-type]
    )
    return watcher, reloads, refusals


def _read(directory: Path) -> CaFiles:
    def get(name: str) -> bytes | None:
        path = directory / name
        return path.read_bytes() if path.exists() else None

    return CaFiles(get("ca-cert.pem"), get("ca-key.pem"), get("cert-chain.pem"), get("root-cert.pem"))


def test_a_new_set_is_taken_once_it_has_held_still_for_one_look(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    watcher, reloads, refusals = _watcher(tmp_path)
    assert watcher.poll() is None and watcher.poll() is not None  # the first judgment: the set in use
    assert watcher.poll() is None and not reloads
    write_plain(tmp_path, cacerts_files(SECOND, ROOT.cert_pem))
    assert watcher.poll() is None  # seen moving: wait one look
    verdict = watcher.poll()
    assert verdict is not None and verdict.event is CaEvent.RELOAD
    assert reloads == ["CN=Intermediate 2"] and not refusals
    assert watcher.poll() is None and watcher.counters.reloads == 1


def test_a_set_written_file_by_file_is_judged_whole(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    watcher, reloads, refusals = _watcher(tmp_path)
    watcher.poll(), watcher.poll()
    new = cacerts_files(SECOND, ROOT.cert_pem)
    write_plain(tmp_path, {"ca-cert.pem": new["ca-cert.pem"]})  # the key is still the old one here
    assert watcher.poll() is None
    write_plain(tmp_path, {"ca-key.pem": new["ca-key.pem"]})
    assert watcher.poll() is None  # moved again since the last look: still waiting
    write_plain(tmp_path, {"cert-chain.pem": new["cert-chain.pem"]})
    assert watcher.poll() is None
    assert watcher.poll() is not None
    assert reloads == ["CN=Intermediate 2"] and refusals == []


def test_a_refused_set_is_reported_once_and_the_next_good_one_is_taken(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    watcher, reloads, refusals = _watcher(tmp_path)
    watcher.poll(), watcher.poll()
    write_plain(tmp_path, cacerts_files(EVIL, ROOT.cert_pem))
    for _ in range(5):
        watcher.poll()
    assert refusals == [Refusal.FOREIGN_ROOT] and reloads == []
    assert watcher.current.signer.key_pem == FIRST.key_pem and "does not lead to a root" in watcher.error
    write_plain(tmp_path, cacerts_files(SECOND, ROOT.cert_pem))
    watcher.poll(), watcher.poll()
    assert reloads == ["CN=Intermediate 2"] and watcher.error == ""
    assert watcher.counters.refusals == {"foreign_root": 1}


def test_files_that_go_away_leave_the_ca_in_use(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    watcher, reloads, refusals = _watcher(tmp_path)
    watcher.poll(), watcher.poll()
    (tmp_path / "ca-key.pem").unlink()
    watcher.poll(), watcher.poll()
    assert refusals == [Refusal.INCOMPLETE] and reloads == []
    assert watcher.current.signer.key_pem == FIRST.key_pem


def test_a_volume_swapped_in_the_middle_of_a_read_is_read_again_not_judged(tmp_path: Path) -> None:
    write_volume(tmp_path, cacerts_files(FIRST, ROOT.cert_pem), 1)
    swaps = {"armed": False, "done": False}

    def read(path: Path) -> bytes:
        data = path.read_bytes()
        if swaps["armed"] and not swaps["done"] and path.name == "ca-cert.pem":
            swaps["done"] = True  # the kubelet renames ..data over between our reads of the cert and the key
            write_volume(tmp_path, cacerts_files(SECOND, ROOT.cert_pem), 3)
        return data

    watcher, reloads, refusals = _watcher(tmp_path, read=read)
    watcher.poll(), watcher.poll()
    write_volume(tmp_path, cacerts_files(crl_pki.intermediate(ROOT, "Intermediate 1b"), ROOT.cert_pem), 2)
    swaps["armed"] = True
    assert watcher.poll() is None  # moved
    assert watcher.poll() is None  # read: the old cert with the new key; torn, not judged
    assert watcher.counters.torn_reads == 1 and refusals == [] and reloads == []
    assert watcher.poll() is None  # the swapped-in set is new: wait one look
    assert watcher.poll() is not None
    assert reloads == ["CN=Intermediate 2"] and refusals == []


def test_an_oversized_file_is_refused_without_being_read(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    reads: list[str] = []

    def read(path: Path) -> bytes:
        reads.append(path.name)
        return path.read_bytes()

    watcher, _, refusals = _watcher(tmp_path, read=read)
    watcher.poll(), watcher.poll()
    (tmp_path / "root-cert.pem").write_bytes(ROOT.cert_pem + b"\n" * (2 * 1024 * 1024))
    reads.clear()
    watcher.poll(), watcher.poll()
    assert refusals == [Refusal.MALFORMED] and "root-cert.pem" not in reads


def _certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def _der_set(pem: bytes) -> set[bytes]:
    return {c.public_bytes(serialization.Encoding.DER) for c in _certs(pem)}


def test_the_fixture_pki_is_valid_at_now() -> None:
    for pair in (ROOT, NEW_ROOT, FIRST, SECOND, UNDER_NEW_ROOT):
        cert = pair.certificate
        assert cert.not_valid_before_utc <= datetime.datetime.fromtimestamp(NOW, tz=datetime.UTC)


async def test_the_watcher_outlives_a_reload_callback_that_fails_and_takes_the_next_set(tmp_path: Path) -> None:
    write_plain(tmp_path, cacerts_files(FIRST, ROOT.cert_pem))
    reloads: list[str] = []

    def on_reload(ca: RootCa, what: str) -> None:
        reloads.append(subject_of(ca.signer.cert_pem))
        if len(reloads) == 1:
            raise ssl.SSLError("the serving certificate could not be loaded")  # a defect in the consumer

    watcher = PluginCaWatcher(
        CaPaths.in_directory(tmp_path),
        plugin_ca_from_files(_read(tmp_path), NOW),
        on_reload=on_reload,
        on_refused=lambda refusal, message: None,
        clock=lambda: NOW,
        interval=0.005,
    )
    task = asyncio.create_task(watcher.run())
    try:
        for wanted, files in ((1, cacerts_files(SECOND, ROOT.cert_pem)), (2, cacerts_files(FIRST, ROOT.cert_pem))):
            write_plain(tmp_path, files)
            async with asyncio.timeout(5):
                for _ in itertools.count():
                    if len(reloads) == wanted:
                        break
                    await asyncio.sleep(0.005)
            assert not task.done()
        assert reloads == ["CN=Intermediate 2", "CN=Intermediate 1"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
