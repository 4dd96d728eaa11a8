"""The broker launcher: jar cache, restart on the same ports, and the CLI."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.broker import KafkaBroker
from aiostream_ckpt_dev.broker.cli import broker_main
from aiostream_ckpt_dev.broker.jars import KAFKA_VERSION, ensure_kafka_jars
from aiostream_ckpt_dev.kafka_wire import metadata_broker_count
from aiostream_ckpt_dev.maven import QUICK_START_JVM_OPTIONS, cache_root

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def test_session_broker_answers_metadata(kafka_broker):
    assert kafka_broker.bootstrap_servers.startswith("127.0.0.1:")
    assert metadata_broker_count("127.0.0.1", kafka_broker.port, timeout_s=5) == 1
    assert "Kafka Server started" in kafka_broker.log_path.read_text()


def test_broker_jvm_runs_with_the_quick_start_options(kafka_broker):
    cmdline = Path(f"/proc/{kafka_broker.pid}/cmdline").read_bytes().split(b"\0")
    assert {o.encode() for o in QUICK_START_JVM_OPTIONS} <= set(cmdline)


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


def test_bad_config_reports_the_cause(tmp_path):
    broker = KafkaBroker(tmp_path / "k", properties={"node.id": "not-a-number"})
    with pytest.raises(ConnectorError, match="Invalid value not-a-number") as info:
        broker.start()
    assert "\tat " not in str(info.value)  # no Java stack frames
    assert not broker.is_running()


def test_port_in_use_reports_the_broker_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = KafkaBroker(tmp_path / "k", port=taken.getsockname()[1])
        with pytest.raises(ConnectorError, match=r"(?s)exited during start-up.*already in use"):
            broker.start()
    assert not broker.is_running()


def test_cli_start_status_stop(tmp_path, monkeypatch, capsys):
    # A private cache root that shares the already downloaded jars.
    cache = tmp_path / "cache"
    cache.mkdir()
    jars = cache_root() / f"kafka-{KAFKA_VERSION}"
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
    finally:
        assert broker_main(["stop"]) == 0
    assert broker_main(["status"]) == 3
    assert "not running" in capsys.readouterr().out

    # A second start reuses the data dir and the port.
    try:
        assert broker_main(["start"]) == 0
        assert capsys.readouterr().out.strip() == bootstrap
    finally:
        assert broker_main(["stop"]) == 0


def test_mvn_failure_reports_its_output(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '[ERROR] Could not resolve dependencies: boom'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(ConnectorError, match=r"(?s)mvn failed.*Could not resolve dependencies"):
        ensure_kafka_jars(tmp_path / "cache")
    assert not (tmp_path / "cache" / "libs" / ".complete").exists()


def test_mvn_runs_with_the_quick_start_options_before_the_users(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "MAVEN_OPTS=$MAVEN_OPTS"\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("MAVEN_OPTS", "-Xmx2g")
    with pytest.raises(ConnectorError) as info:
        ensure_kafka_jars(tmp_path / "cache")
    assert f"MAVEN_OPTS={' '.join(QUICK_START_JVM_OPTIONS)} -Xmx2g" in str(info.value)


def test_concurrent_callers_run_mvn_once(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    runs = tmp_path / "runs"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo run >> {runs}\n"
        "sleep 1\n"
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#*=}";; esac; done\n'
        'touch "$out/kafka_2.13-0.jar"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: ensure_kafka_jars(tmp_path / "cache"), range(4)))
    assert len(set(results)) == 1
    assert runs.read_text().count("run") == 1
