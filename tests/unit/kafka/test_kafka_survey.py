"""The Kafka sink's output survey: what a restore would repeat that it cannot retract."""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.connectors.base import ConnectorContext, RestoreInfo
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.writer import TransactionalKafkaWriter


def writer(topic: str, restore: RestoreInfo | None) -> TransactionalKafkaWriter:
    sink = KafkaSink(topic, "127.0.0.1:9092")
    ctx = ConnectorContext("job", "sink", 0, 1, restore=restore)
    w = sink.create_writer(ctx)
    assert isinstance(w, TransactionalKafkaWriter)
    return w


def restore(newer: tuple[int, ...]) -> RestoreInfo:
    return RestoreInfo("checkpoint", 4, "/c/chk-4", "tag", newer)


def test_newer_committed_checkpoints_cannot_be_retracted() -> None:
    survey = writer("out", restore((5, 6, 7))).survey({"pending": [], "topic": "out"}, 4)
    assert (
        survey.kept
        == "cannot retract committed Kafka transactions of checkpoints 5..7 on topic out"
    )
    assert not survey.retract and not survey.lost


def test_nothing_newer_or_a_new_topic_keeps_nothing() -> None:
    assert writer("out", restore(())).survey({"topic": "out"}, 4).kept == ""
    assert writer("out", None).survey(None, None).kept == ""
    # another topic than the restored state's is a fresh output (blue/green)
    assert writer("out-2", restore((5,))).survey({"topic": "out"}, 4).kept == ""
    # a state written before the topic was recorded counts as this topic
    assert (
        "of checkpoint 5 on topic out"
        in writer("out", restore((5,))).survey({"pending": []}, 4).kept
    )


def test_state_and_merged_states_record_the_topic() -> None:
    assert writer("out", None).state()["topic"] == "out"
    merged = TransactionalKafkaWriter.merge_states([None, {"pending": [], "topic": "out"}])
    assert merged["topic"] == "out"
    assert "topic" not in TransactionalKafkaWriter.merge_states([{"pending": []}])


def test_committed_after_counts_kept_set_aside_and_the_stop_savepoint(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    for cid in (3, 4, 6):
        storage.checkpoint_dir(cid).mkdir()
        (storage.checkpoint_dir(cid) / "_metadata").write_bytes(b"x")
    storage.checkpoint_dir(8).mkdir()  # never completed: its output was never committed
    storage.checkpoint_dir(7).with_name("chk-0000000007.bad").mkdir()
    assert storage.committed_after(3) == [4, 6, 7]
    assert storage.committed_after(7) == []
    storage.record_stop_savepoint(tmp_path / "sp", 9)
    assert storage.committed_after(6) == [7, 9]
    storage.set_aside_stop_savepoint("bad")
    assert storage.committed_after(6) == [7, 9]
