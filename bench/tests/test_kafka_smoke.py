"""The Kafka path end to end on a tiny input: a real broker, ours and the bare aiokafka loop."""

import json
from pathlib import Path

import pytest

from bench.cli import main


@pytest.mark.integration
@pytest.mark.kafka
def test_kafka_path_ours_and_bare_aiokafka(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    code = main(
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
            "--no-plots",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    runs = {(r["system"], r["path"]): r for r in doc["runs"]}
    assert set(runs) == {("aiostream-ckpt", "kafka"), ("bare-aiokafka", "kafka")}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["exactly_once_verified"] is True
        assert run["events_per_s"] > 0
    assert runs[("bare-aiokafka", "kafka")]["ratio_to_ours"]["events_per_s"] > 0
