"""The Confluent wire format of registry-encoded Kafka values (pure: no IO).

Magic byte 0, the schema id as a 4-byte big-endian integer, then, for protobuf only, the message
indexes (zigzag varints: a count then the indexes; the common path [0] is the single byte 0), then
the serialized payload.
"""

from __future__ import annotations

from collections.abc import Sequence

MAGIC_BYTE = 0
HEADER_SIZE = 5


class WireFormatError(ValueError):
    """A value that is not a Confluent-framed record; `reason` goes to `__dpone__corrupt`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _zigzag_varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded & ~0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _read_zigzag_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(data):
            raise WireFormatError("truncated protobuf message indexes")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise WireFormatError("malformed protobuf message index varint")


def encode_message_indexes(indexes: Sequence[int]) -> bytes:
    if not indexes:
        raise ValueError("protobuf message indexes must not be empty")
    if list(indexes) == [0]:
        return b"\x00"  # the first top-level message: Confluent's one-byte shorthand
    return _zigzag_varint(len(indexes)) + b"".join(_zigzag_varint(i) for i in indexes)


def decode_message_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    """(indexes, position after them); a count of 0 is the shorthand for [0]."""
    count, pos = _read_zigzag_varint(data, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > len(data) - pos:
        raise WireFormatError(f"bad protobuf message index count {count}")
    indexes = []
    for _ in range(count):
        index, pos = _read_zigzag_varint(data, pos)
        indexes.append(index)
    return indexes, pos


def frame(schema_id: int, payload: bytes, message_indexes: Sequence[int] | None = None) -> bytes:
    head = bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big", signed=False)
    if message_indexes is not None:
        head += encode_message_indexes(message_indexes)
    return head + payload


def unframe(value: bytes, with_indexes: bool = False) -> tuple[int, list[int] | None, bytes]:
    """(schema_id, message indexes or None, payload); `with_indexes` for protobuf values."""
    if len(value) < HEADER_SIZE:
        if value and value[0] != MAGIC_BYTE:
            raise WireFormatError(f"wrong magic byte 0x{value[0]:02x}")
        raise WireFormatError(f"too short for the registry wire format ({len(value)} bytes)")
    if value[0] != MAGIC_BYTE:
        raise WireFormatError(f"wrong magic byte 0x{value[0]:02x}")
    schema_id = int.from_bytes(value[1:HEADER_SIZE], "big", signed=False)
    if not with_indexes:
        return schema_id, None, bytes(value[HEADER_SIZE:])
    indexes, pos = decode_message_indexes(bytes(value), HEADER_SIZE)
    return schema_id, indexes, bytes(value[pos:])
