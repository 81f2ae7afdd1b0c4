"""What a look at the plug-in CA's CRL file means (ambit.controlplane.ca.crl), and the watcher's bookkeeping."""

from __future__ import annotations

import os
from pathlib import Path

from tests import crl_pki

from ambit.controlplane.ca.crl import CrlEvent, CrlFileWatcher, judge_crl_file

ROOT = crl_pki.root()
GOOD = crl_pki.crl(ROOT, [7])


def test_no_file_and_nothing_published_is_no_news() -> None:
    assert judge_crl_file(None, None).event is CrlEvent.UNCHANGED


def test_a_new_good_file_is_published_and_the_same_content_again_is_not() -> None:
    verdict = judge_crl_file(GOOD, None, [ROOT.cert_pem])
    assert verdict.event is CrlEvent.PUBLISH and verdict.value == GOOD.decode() and verdict.message == ""
    assert judge_crl_file(GOOD, GOOD.decode()).event is CrlEvent.UNCHANGED


def test_an_empty_file_is_published_as_no_revocations() -> None:
    assert judge_crl_file(b"", GOOD.decode()).event is CrlEvent.PUBLISH


def test_a_file_that_is_not_crls_is_refused() -> None:
    for data in (b"garbage", "é".encode(), ROOT.cert_pem):
        verdict = judge_crl_file(data, GOOD.decode())
        assert verdict.event is CrlEvent.REFUSED and "not published" in verdict.message


def test_a_crl_in_our_roots_name_not_signed_by_it_is_published_with_a_warning() -> None:
    forged = crl_pki.crl(ROOT, [1], signer=crl_pki.root("Forger"))
    verdict = judge_crl_file(forged, None, [ROOT.cert_pem])
    assert verdict.event is CrlEvent.PUBLISH and "not signed by that CA" in verdict.message


def test_a_file_that_went_away_keeps_what_was_published() -> None:
    verdict = judge_crl_file(None, GOOD.decode())
    assert verdict.event is CrlEvent.MISSING and "stays" in verdict.message


def test_the_watcher_publishes_each_change_once_and_reports_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "ca-crl.pem"
    published: list[str] = []
    watcher = CrlFileWatcher(path, published.append, anchors=[ROOT.cert_pem])
    assert watcher.poll().event is CrlEvent.UNCHANGED
    path.write_bytes(GOOD)
    assert watcher.poll().event is CrlEvent.PUBLISH
    assert watcher.poll().event is CrlEvent.UNCHANGED
    path.write_bytes(b"bad")
    os.utime(path, ns=(1, 1))
    assert watcher.poll().event is CrlEvent.REFUSED
    assert watcher.error
    second = crl_pki.crl(ROOT, [7, 8])
    path.write_bytes(second)
    os.utime(path, ns=(2, 2))
    assert watcher.poll().event is CrlEvent.PUBLISH
    assert watcher.error == ""
    path.unlink()
    assert watcher.poll().event is CrlEvent.MISSING
    assert published == [GOOD.decode(), second.decode()]
