"""The anonymous files TLS contexts load keys from (:func:`ambit.tls.contexts._memory_file`), and their fallback."""

from __future__ import annotations

import os
import stat

import pytest

from ambit.tls.contexts import _memory_file


def test_a_memory_file_holds_the_data_only_inside_the_block() -> None:
    with _memory_file(b"secret key") as path:
        assert path.startswith("/proc/self/fd/")
        with open(path, "rb") as file:
            assert file.read() == b"secret key"
    assert not os.path.exists(path)


def test_without_memfd_the_data_goes_to_a_private_temporary_file_removed_afterwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    with _memory_file(b"secret key") as path:
        assert not path.startswith("/proc/")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, "rb") as file:
            assert file.read() == b"secret key"
    assert not os.path.exists(path)
