"""aiostream_ckpt_dev.kafka_wire: the ListOffsets request and response, byte for byte."""

from __future__ import annotations

import struct

import pytest

from aiostream_ckpt_dev.kafka_wire import decode_list_offsets, encode_list_offsets
from tests.helpers import list_offsets_response, parse_list_offsets_request


def test_list_offsets_request_is_v2_latest_read_uncommitted() -> None:
    framed = encode_list_offsets("pv-out", [0, 1, 2, 3], 42)
    (size,) = struct.unpack_from(">i", framed)
    assert size == len(framed) - 4
    assert parse_list_offsets_request(framed[4:]) == (2, 2, 42, "pv-out", [0, 1, 2, 3])


def test_list_offsets_response_decodes_and_checks() -> None:
    body = list_offsets_response(9, "t", {0: 10, 1: 0, 2: 5, 3: 7})
    assert decode_list_offsets(body, 9) == {0: 10, 1: 0, 2: 5, 3: 7}
    with pytest.raises(OSError, match="correlation"):
        decode_list_offsets(body, 8)
    with pytest.raises(OSError, match="error code 3"):
        decode_list_offsets(list_offsets_response(9, "t", {0: 1}, err=3), 9)
