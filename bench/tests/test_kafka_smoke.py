"""The Kafka path end to end on a tiny input: a real broker, ours and the bare aiokafka loop."""

from pathlib import Path

import pytest

from bench.tests.cli_run import run_bench


@pytest.mark.integration
@pytest.mark.kafka
def test_kafka_path_ours_and_bare_aiokafka(tmp_path: Path) -> None:
    runs = run_bench(
        tmp_path,
        [
            "--path",
            "kafka",
            "--systems",
            "aiostream-ckpt,bare-aiokafka",
            "--events",
            "20000",
            "--repeats",
            "1",
            "--quiet-wait",
            "0",
        ],
    )
    assert set(runs) == {("aiostream-ckpt", "kafka"), ("bare-aiokafka", "kafka")}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["exactly_once_verified"] is True
        assert run["events_per_s"] > 0
    assert runs[("bare-aiokafka", "kafka")]["ratio_to_ours"]["events_per_s"] > 0
