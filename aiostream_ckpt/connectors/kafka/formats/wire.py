"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, the payload.

Every registry-aware Kafka client (Confluent's serializers, Karapace's, Flink's
``avro-confluent`` format) frames a record this way, so a topic written by one
is read by the others. Protobuf adds, after the id, the path of the message
type inside its ``.proto`` file (*message indexes*): a zigzag varint count,
then that many zigzag varint indexes, with the common case ``[0]`` (the
file's first message) written as the single byte ``0``.
"""

from __future__ import annotations

from aiostream_ckpt.errors import ConnectorError

MAGIC = 0
#: Bytes before the payload: magic byte and schema id.
HEADER = 5


class WireFormatError(ConnectorError):
    """A record is not in the Confluent wire format (the record's fault: it is dead-lettered)."""


def frame(schema_id: int) -> bytes:
    """Return the 5-byte header for ``schema_id``."""
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big")


def schema_id_of(data: bytes) -> int:
    """Return the schema id of a framed record; ``WireFormatError`` if it is not framed."""
    if len(data) < HEADER or data[0] != MAGIC:
        got = f"magic byte {data[0]}" if data else "an empty record"
        raise WireFormatError(
            f"not in the Confluent wire format ({got}, {len(data)} bytes; expected "
            "magic byte 0 and a 4-byte schema id)"
        )
    return int.from_bytes(data[1:HEADER], "big")


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_message_indexes(indexes: list[int]) -> bytes:
    """Encode a Protobuf message's path in its file; ``[0]`` is the single byte ``0``."""
    if indexes == [0]:
        return b"\x00"
    return _varint(_zigzag(len(indexes))) + b"".join(_varint(_zigzag(i)) for i in indexes)


def decode_message_indexes(data: bytes | memoryview, pos: int) -> tuple[list[int], int]:
    """Read message indexes at ``pos``; return them and the payload's start."""

    def read(at: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            if at >= len(data) or shift > 63:
                raise WireFormatError("truncated Protobuf message indexes")
            byte = data[at]
            result |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                return _unzigzag(result), at
            shift += 7

    count, pos = read(pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > 64:
        raise WireFormatError(f"bad Protobuf message index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = read(pos)
        indexes.append(i)
    return indexes, pos
