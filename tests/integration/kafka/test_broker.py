"""The broker launcher: jar cache, restart on the same ports, and the CLI."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from aiostream_ckpt.connectors.kafka import broker as broker_mod
from aiostream_ckpt.connectors.kafka.broker import (
    KAFKA_VERSION,
    KafkaBroker,
    broker_main,
    ensure_kafka_jars,
    metadata_broker_count,
)
from aiostream_ckpt.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def test_session_broker_answers_metadata(kafka_broker):
    assert kafka_broker.bootstrap_servers.startswith("127.0.0.1:")
    assert metadata_broker_count("127.0.0.1", kafka_broker.port, timeout_s=5) == 1
    assert "Kafka Server started" in kafka_broker.log_path.read_text()


def test_cached_jars_are_reused(kafka_broker):
    libs = ensure_kafka_jars()
    stamp = (libs / ".complete").stat().st_mtime_ns
    assert ensure_kafka_jars() == libs
    assert (libs / ".complete").stat().st_mtime_ns == stamp
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").exists()


def test_unfinished_download_is_redone(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "half.jar").write_bytes(b"")  # no stamp: an interrupted run
    assert ensure_kafka_jars(tmp_path) == libs
    assert not (libs / "half.jar").exists()
    assert (libs / ".complete").exists()


def test_missing_java_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="Java not found"):
        KafkaBroker(tmp_path / "k", libs_dir=tmp_path).start()


def test_broker_that_cannot_start_reports_its_log(tmp_path):
    broker = KafkaBroker(tmp_path / "k", properties={"node.id": "not-a-number"})
    with pytest.raises(Exception, match=r"(?s)node\.id.*not-a-number"):
        broker.start()
    assert not broker.is_running()


def test_cli_start_status_stop(tmp_path, monkeypatch, capsys):
    # A private cache root that shares the already downloaded jars.
    cache = tmp_path / "cache"
    cache.mkdir()
    jars = broker_mod.cache_root() / f"kafka-{KAFKA_VERSION}"
    ensure_kafka_jars(jars)
    (cache / f"kafka-{KAFKA_VERSION}").symlink_to(jars)
    monkeypatch.setenv("AIOSTREAM_CACHE_DIR", str(cache))
    try:
        assert broker_main(["start"]) == 0
        bootstrap = capsys.readouterr().out.strip()
        host, port = bootstrap.split(":")
        assert host == "127.0.0.1"
        assert metadata_broker_count(host, int(port), timeout_s=5) == 1

        assert broker_main(["start"]) == 0  # idempotent
        assert capsys.readouterr().out.strip() == bootstrap
        assert broker_main(["status"]) == 0
        assert capsys.readouterr().out.startswith(bootstrap)
        pid = broker_mod._read_state()["pid"]  # type: ignore[index]
    finally:
        assert broker_main(["stop"]) == 0
    assert broker_main(["status"]) == 3
    assert "not running" in capsys.readouterr().out
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the detached JVM is reaped by init, not by us
    assert not Path(f"/proc/{pid}/cmdline").exists() or b"kafka" not in Path(
        f"/proc/{pid}/cmdline"
    ).read_bytes()
    assert os.environ["AIOSTREAM_CACHE_DIR"] == str(cache)
