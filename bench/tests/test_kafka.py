import collections
import socket
import struct
import threading
from pathlib import Path

import pytest

from bench import kafka, kafka_systems
from bench.kafka import not_run, select_paths
from bench.kafka_offsets import EndOffsetSampler
from bench.kafka_recount import recount_values
from bench.kafka_systems import KafkaSpec, KafkaWorkload, OursKafka
from bench.systems import Workload
from tests.helpers import list_offsets_response, parse_list_offsets_request


def test_sampler_sums_end_offsets_from_a_fake_broker() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    requests: list[int] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            n = 0
            while True:
                head = conn.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return
                frame = conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                _, _, cid, topic, parts = parse_list_offsets_request(frame)
                n += 1
                requests.append(cid)
                body = list_offsets_response(cid, topic, {p: 100 * n + p for p in parts})
                conn.sendall(struct.pack(">i", len(body)) + body)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    sampler = EndOffsetSampler("127.0.0.1", port, "out", 2)
    try:
        sampler(0.05)  # the first call samples
        sampler(0.10)  # within SAMPLE_EVERY_S of the previous: skipped
        sampler(0.30)
        sampler.sample_at(0.31)
    finally:
        sampler.close()
        srv.close()
    t.join(2)
    assert sampler.samples[0] == (0.0, 0.0)
    assert [v for _, v in sampler.samples[1:]] == [201.0, 401.0, 601.0]
    assert [v for _, v in sampler.per_partition[1:]] == [(100, 101), (200, 201), (300, 301)]
    assert len(requests) == 3 and len(set(requests)) == 3


def test_sampler_skips_a_failed_sample() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.close()  # nobody listens
    sampler = EndOffsetSampler("127.0.0.1", port, "out", 4)
    sampler(1.0)
    assert sampler.samples == [(0.0, 0.0)]


def test_recount_values_accepts_exactly_once_and_refuses_the_rest() -> None:
    expected = collections.Counter({"a": 2, "b": 1})
    good = [b'{"app_id":"a","pv":1}', b'{"app_id":"b","pv":1}', b'{"app_id":"a","pv":2}']
    v = recount_values(good, expected)
    assert v.passed and v.summary == "exactly-once"
    assert v.counts["records_out"] == 3 and v.counts["events_in"] == 3
    dup = recount_values([*good, b'{"app_id":"a","pv":2}'], expected)
    assert dup.passed is False and dup.counts["problems"] >= 1
    missing = recount_values(good[:2], expected)
    assert missing.passed is False and "final pv 1" in missing.summary
    junk = recount_values([*good, b"not json", b'{"x":1}'], expected)
    assert junk.passed is False and junk.counts["malformed_out"] == 2


@pytest.mark.parametrize(
    ("path", "full", "systems", "explicit", "want"),
    [
        (None, False, ["aiostream-ckpt", "bare-loop", "bytewax"], False, (True, False)),
        (None, True, ["aiostream-ckpt", "bare-loop", "bytewax", "pyflink"], False, (True, True)),
        (
            None,
            False,
            ["aiostream-ckpt", "bare-aiokafka", "quixstreams", "faust"],
            True,
            (False, True),
        ),
        (None, False, ["aiostream-ckpt", "bare-loop", "faust"], True, (True, True)),
        (None, False, ["aiostream-ckpt"], True, (True, False)),
        ("kafka", False, ["aiostream-ckpt"], True, (False, True)),
        ("both", False, ["aiostream-ckpt"], False, (True, True)),
        ("embedded", True, ["aiostream-ckpt", "faust"], True, (True, False)),
    ],
)
def test_select_paths(path, full, systems, explicit, want) -> None:
    assert select_paths(path, full=full, systems=systems, explicit=explicit) == want


def test_not_run_lists_only_kafka_systems() -> None:
    runs = not_run(["aiostream-ckpt", "bare-loop", "faust"], "quick mode")
    assert [(r.system, r.path, r.status) for r in runs] == [
        ("aiostream-ckpt", "kafka", "unavailable"),
        ("faust", "kafka", "unavailable"),
    ]


def test_ours_kafka_command(tmp_path: Path) -> None:
    src = Workload((tmp_path / "in.jsonl",), 10, 2, 1, 0.0, 0)
    wl = KafkaWorkload("127.0.0.1:9092", "pv-in", 4, src)
    spec = KafkaSpec(wl, tmp_path, "pv-out-x", interval_s=1.0, sets=["state.x=1"])
    cmd = OursKafka().command(spec, tmp_path / "ckpt")
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert cmd[2:5] == ["aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
    for want in (
        "app.kafka_bootstrap=127.0.0.1:9092",
        "app.input_topic=pv-in",
        "app.output_topic=pv-out-x",
        "app.stop_at_end=1",
        "checkpoint.interval=1.0",
        "checkpoint.mode=exactly_once",
        "rest.enabled=false",
        "state.x=1",
    ):
        assert want in sets
    assert wl.host_port == ("127.0.0.1", 9092)


def test_every_kafka_system_has_a_runner() -> None:
    for name in kafka.KAFKA_SYSTEMS:
        system = kafka_systems.system_for(name)
        assert system is not None and system.name == name
    assert kafka_systems.system_for("bytewax") is None
