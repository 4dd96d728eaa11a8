"""The one hand-written Kafka wire codec of the tooling: two requests on a blocking socket.

The broker's readiness probe and the bench's end-offset sampler ask a broker
one small question many times, from code that has no event loop (pytest
fixtures, the broker CLI, the bench's 50 ms monitor). A client library would
bring a loop, a metadata refresh and a group of its own; two fixed-version
requests framed by hand do not. The engine's connectors use aiokafka, never
this module.

Frames (Kafka protocol guide): a request is ``size:int32`` then header v1
(``api_key:int16, api_version:int16, correlation_id:int32, client_id:string``)
and the body; a response is ``size:int32`` then ``correlation_id:int32`` and
the body.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

METADATA = 3
LIST_OFFSETS = 2


def encode_request(
    api_key: int, api_version: int, correlation_id: int, body: bytes, client_id: bytes
) -> bytes:
    """Frame a request: size, header v1, body.

    >>> encode_request(METADATA, 1, 7, b"", b"c").hex(" ", -2)  # size, key, version, id, client
    '0000 000b 0003 0001 0000 0007 0001 63'
    """
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id))
    msg = header + client_id + body
    return struct.pack(">i", len(msg)) + msg


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes of a Kafka response (a closed socket is an error)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def recv_response(sock: socket.socket) -> bytes:
    """Read one response frame; return its body (``correlation_id`` and on)."""
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def metadata_broker_count(host: str, port: int, *, timeout_s: float) -> int:
    """Send a Metadata v1 request for no topics and return how many brokers it lists.

    A KRaft broker answers only once it's unfenced; before that the listener
    accepts the connection but stays silent, so this is its readiness check.
    """
    # body: topics = empty array, meaning "no topics" (null would mean all)
    request = encode_request(METADATA, 1, 7, struct.pack(">i", 0), b"aiostream-ckpt-probe")
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(request)
        body = recv_response(sock)
    correlation_id, n_brokers = struct.unpack_from(">ii", body)
    if correlation_id != 7:
        raise OSError(f"bad correlation id {correlation_id} in Metadata response")
    return int(n_brokers)


def encode_list_offsets(
    topic: str, partitions: Sequence[int], correlation_id: int, client_id: bytes = b"bench"
) -> bytes:
    """Frame a ListOffsets v2 request for the latest offsets (read_uncommitted: high watermark).

    >>> encode_list_offsets("t", [0], 7)[:4] == struct.pack(">i", 43)
    True
    """
    name = topic.encode()
    # replica_id -1 (a client), isolation 0 (read_uncommitted), one topic
    body = struct.pack(">ib", -1, 0) + struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">i", len(partitions))
    for p in partitions:
        body += struct.pack(">iq", p, -1)  # timestamp -1: the latest offset
    return encode_request(LIST_OFFSETS, 2, correlation_id, body, client_id)


def decode_list_offsets(body: bytes, correlation_id: int) -> dict[int, int]:
    """Decode a ListOffsets v2 response body (after the size prefix) to ``{partition: offset}``."""
    cid, _throttle, n_topics = struct.unpack_from(">iii", body, 0)
    if cid != correlation_id:
        raise OSError(f"ListOffsets: correlation id {cid}, expected {correlation_id}")
    pos = 12
    out: dict[int, int] = {}
    for _ in range(n_topics):
        (name_len,) = struct.unpack_from(">h", body, pos)
        pos += 2 + name_len
        (n_parts,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(n_parts):
            part, err, _ts, offset = struct.unpack_from(">ihqq", body, pos)
            pos += 22
            if err != 0:
                raise OSError(f"ListOffsets: partition {part} error code {err}")
            out[part] = offset
    return out


def end_offsets(
    sock: socket.socket, topic: str, partitions: Sequence[int], correlation_id: int
) -> dict[int, int]:
    """Ask the broker on ``sock`` for each partition's high watermark."""
    sock.sendall(encode_list_offsets(topic, partitions, correlation_id))
    return decode_list_offsets(recv_response(sock), correlation_id)
