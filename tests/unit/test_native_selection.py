"""``ambit.native.select``: what ``AMBIT_NATIVE`` asks for, and what a process gets."""

from __future__ import annotations

import pytest

from ambit import native


def test_zero_selects_the_pure_python_path_whether_or_not_the_extension_is_built() -> None:
    chosen = native.select({"AMBIT_NATIVE": "0"})
    assert chosen.tls_records is None and chosen.name == "python"
    assert "AMBIT_NATIVE=0" in chosen.describe()


def test_unset_uses_the_extension_when_it_loads_and_falls_back_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = native.load_tls_records()
    assert native.select({}).tls_records is module
    monkeypatch.setattr(native, "load_tls_records", lambda: (None, "not built"))
    fallback = native.select({"AMBIT_NATIVE": ""})
    assert fallback.tls_records is None and fallback.describe() == "python (not built)"


def test_one_without_a_usable_extension_is_an_error_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "load_tls_records", lambda: (None, "not built"))
    with pytest.raises(native.NativeError, match=r"AMBIT_NATIVE=1 .*not built"):
        native.select({"AMBIT_NATIVE": "1"})


@pytest.mark.parametrize("value", ["yes", "true", "2", " 1"])
def test_anything_but_zero_or_one_is_refused(value: str) -> None:
    with pytest.raises(native.NativeError, match="expected 0"):
        native.select({"AMBIT_NATIVE": value})


def test_the_process_selection_is_made_once_and_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMBIT_NATIVE", "0")
    native.use(None)
    try:
        first = native.selection()
        monkeypatch.setenv("AMBIT_NATIVE", "bogus")  # read once: later changes do not count
        assert native.selection() is first and first.tls_records is None
        forced = native.NativeSelection(None, "forced")
        native.use(forced)
        assert native.selection() is forced
    finally:
        native.use(None)


def test_the_hbone_data_path_comes_with_the_native_records_only_and_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    on = {"AMBIT_NATIVE_DATA": "1"}
    assert native.select({"AMBIT_NATIVE": "0", **on}).hbone_data is None
    assert native.select({}).hbone_data is None  # step 2 is opt-in until the lab has measured it
    module = native.load_hbone_data()
    chosen = native.select(on) if module is not None else None
    if chosen is not None and chosen.tls_records is not None:
        assert chosen.hbone_data is module and "HBONE DATA frames in C" in chosen.describe()
    monkeypatch.setattr(native, "load_tls_records", lambda: (None, "not built"))
    assert native.select(on).hbone_data is None  # no records in C: DATA frames stay in the Python engine
    monkeypatch.undo()
    monkeypatch.setattr(native, "load_hbone_data", lambda: None)
    if native.select({}).tls_records is not None:
        with pytest.raises(native.NativeError, match="AMBIT_NATIVE_DATA=1"):
            native.select(on)
        assert "HBONE DATA frames in Python" in native.select({}).describe()
    with pytest.raises(native.NativeError, match="AMBIT_NATIVE_DATA='yes'"):
        native.select({"AMBIT_NATIVE_DATA": "yes"})


def test_the_relay_sockets_in_c_come_with_the_native_data_path_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step 3 (``relay_socket.c``) rides on step 2: on wherever DATA frames are in C, off with AMBIT_NATIVE_RELAY=0,
    never without them."""
    on = {"AMBIT_NATIVE_DATA": "1"}
    assert native.select({"AMBIT_NATIVE": "0", **on}).relay_sockets is None
    assert native.select({}).relay_sockets is None  # no DATA frames in C: no relay sockets in C
    with pytest.raises(native.NativeError, match="AMBIT_NATIVE_RELAY='on'"):
        native.select({**on, "AMBIT_NATIVE_RELAY": "on"})
    module = native.load_hbone_data()
    if module is None or native.select({}).tls_records is None:
        pytest.skip("the native extensions are not built")
    chosen = native.select(on)
    assert chosen.relay_sockets is module and "relay sockets in C" in chosen.describe()
    assert native.select({**on, "AMBIT_NATIVE_RELAY": "1"}).relay_sockets is module
    off = native.select({**on, "AMBIT_NATIVE_RELAY": "0"})
    assert off.hbone_data is module and off.relay_sockets is None and "relay sockets in Python" in off.describe()
