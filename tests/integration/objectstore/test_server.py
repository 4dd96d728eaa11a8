"""The S3 server of the tests (SeaweedFS) and our client against it.

Why SeaweedFS carries the exactly-once tier: its conditional writes are atomic
(one winner of a race) and a multipart upload cannot complete over an
existing key with If-None-Match. These tests pin both, and how the client
names a store it cannot use.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from aiostream_ckpt.checkpoint.chain import CheckpointChain
from aiostream_ckpt.errors import FencedError, ObjectStoreError, PreconditionFailedError
from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore, S3Settings
from aiostream_ckpt_dev.s3server import SeaweedS3

pytestmark = pytest.mark.integration


def _store(server: SeaweedS3, **settings: object) -> ObjectStore:
    base = {"endpoint_url": server.endpoint_url, "max_attempts": 2, **settings}
    return ObjectStore(S3Settings(**base), server.buckets[0])  # type: ignore[arg-type]


def test_one_winner_of_a_create_race(s3_server: SeaweedS3) -> None:
    store = _store(s3_server)
    for k in range(5):
        key = f"race-{uuid.uuid4().hex}"
        winners: list[int] = []
        start = threading.Barrier(16)

        def put(
            i: int, key: str = key, start: threading.Barrier = start, winners: list[int] = winners
        ) -> None:
            start.wait()
            try:
                store.put_bytes(key, b"%d" % i, if_none_match=True)
                winners.append(i)
            except PreconditionFailedError:
                pass

        threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1, (k, winners)
        assert store.get_bytes(key)[0] == b"%d" % winners[0]


def test_if_match_with_a_stale_etag_loses(s3_server: SeaweedS3) -> None:
    store = _store(s3_server)
    key = f"cas-{uuid.uuid4().hex}"
    first = store.put_bytes(key, b"1", if_none_match=True)
    store.put_bytes(key, b"2", if_match=first)
    with pytest.raises(PreconditionFailedError):
        store.put_bytes(key, b"3", if_match=first)
    assert store.get_bytes(key)[0] == b"2"


def test_multipart_cannot_complete_over_an_existing_object(s3_server: SeaweedS3) -> None:
    store = _store(s3_server)
    key = f"mp-{uuid.uuid4().hex}"
    upload = store.create_multipart(key)
    etags = [
        store.upload_part(key, upload, 1, b"a" * (5 << 20)),
        store.upload_part(key, upload, 2, b"b"),
    ]
    store.put_bytes(key, b"already here", if_none_match=True)
    with pytest.raises(PreconditionFailedError):
        store.complete_multipart(key, upload, etags)
    assert store.get_bytes(key)[0] == b"already here"
    store.abort_multipart(key, upload)


def test_refused_credentials_are_a_clear_error(
    s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ObjectStoreError, match="refused these credentials") as info:
        _store(s3_server).check_bucket()
    assert not info.value.retriable


def test_missing_bucket_is_a_clear_error(s3_server: SeaweedS3) -> None:
    store = ObjectStore(S3Settings(endpoint_url=s3_server.endpoint_url), "no-such-bucket-x")
    with pytest.raises(ObjectStoreError, match=r"does not exist|NoSuchBucket|404") as info:
        store.check_bucket()
    assert not info.value.retriable


def test_unreachable_store_is_retriable_and_named(s3_server: SeaweedS3) -> None:
    from aiostream_ckpt_dev.broker.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    store = ObjectStore(S3Settings(endpoint_url=url, max_attempts=1), "aiostream")
    with pytest.raises(ObjectStoreError, match="cannot reach the store") as info:
        store.check_bucket()
    assert info.value.retriable
    assert url in str(info.value)


def test_a_second_claim_fences_the_first_owner(s3_server: SeaweedS3, s3_prefix: str) -> None:
    location = ObjectLocation.parse(s3_prefix)
    old = CheckpointChain(_store(s3_server), location, "job")
    old.claim()
    old.update({"high_water": 3})
    new = CheckpointChain(_store(s3_server), location, "job")
    new.claim()
    assert new.generation == old.generation + 1
    assert new.state["high_water"] == 3
    with pytest.raises(FencedError, match="another daemon took over"):
        old.update({"high_water": 4})
    new.update({"high_water": 5})
    body, _ = new.read()
    assert body is not None and body["high_water"] == 5


def test_restart_keeps_the_objects(s3_server: SeaweedS3) -> None:
    store = _store(s3_server, max_attempts=8)
    key = f"keep-{uuid.uuid4().hex}"
    store.put_bytes(key, b"kept")
    s3_server.restart()
    assert store.get_bytes(key)[0] == b"kept"
