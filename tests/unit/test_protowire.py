"""The hand encoder of the protobuf wire format (ambit.protowire rules 1-2), read back by the protobuf runtime:
the well-known wrapper messages for integers and bytes, and the runtime's unknown-field reader for any field
number and wire type."""

from __future__ import annotations

from google.protobuf import empty_pb2, wrappers_pb2
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import given
from hypothesis import strategies as st

from ambit import protowire

UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FIELD_NUMBERS = st.integers(min_value=1, max_value=2**29 - 1)
DATA = st.binary(max_size=300)  # past 127 and 255: two-byte lengths


def _unknown(data: bytes) -> list[tuple[int, int, object]]:
    """(number, wire type, value) of every field of ``data``, as the protobuf runtime reads them."""
    message = empty_pb2.Empty.FromString(data)
    return [(field.field_number, field.wire_type, field.data) for field in UnknownFieldSet(message)]


@given(UINT64)
def test_an_unsigned_varint_reads_back_as_the_same_uint64(value: int) -> None:
    assert wrappers_pb2.UInt64Value.FromString(protowire.varint_field(1, value)).value == value


@given(INT64)
def test_a_negative_int64_is_written_as_its_twos_complement(value: int) -> None:
    encoded = protowire.varint_field(1, value)
    assert wrappers_pb2.Int64Value.FromString(encoded).value == value
    if value < 0:
        assert len(protowire.varint(value)) == 10


@given(UINT64)
def test_a_varint_is_what_the_runtime_writes(value: int) -> None:
    assert protowire.varint_field(1, value) == wrappers_pb2.UInt64Value(value=value).SerializeToString()
    assert len(protowire.varint(value)) <= 10


@given(DATA)
def test_a_bytes_field_reads_back_and_matches_the_runtime(data: bytes) -> None:
    encoded = protowire.bytes_field(1, data)
    assert wrappers_pb2.BytesValue.FromString(encoded).value == data
    assert encoded == wrappers_pb2.BytesValue(value=data).SerializeToString()


@given(FIELD_NUMBERS, UINT64, FIELD_NUMBERS, DATA)
def test_any_field_number_reads_back_with_its_wire_type_and_value(
    int_number: int, value: int, bytes_number: int, data: bytes
) -> None:
    encoded = protowire.key(int_number, protowire.VARINT) + protowire.varint(value)
    encoded += protowire.length_delimited(bytes_number, data)
    assert _unknown(encoded) == [(int_number, protowire.VARINT, value), (bytes_number, protowire.LENGTH, data)]


def test_proto3_defaults_are_left_off_the_wire_unless_always_written() -> None:
    assert protowire.varint_field(3, 0) == b""
    assert protowire.bytes_field(3, b"") == b""
    assert protowire.length_delimited(3, b"") == b"\x1a\x00"
    assert protowire.varint(0) == b"\x00"
    assert protowire.varint(300) == b"\xac\x02"
    assert protowire.varint(2**64) == b"\x00"  # modulo 2**64 (rule 1)
