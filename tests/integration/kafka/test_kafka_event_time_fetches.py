"""Event time from a Kafka partition does not depend on how it is fetched.

Which events are late, and how sessions merge, depend on the watermark each
event meets. The watermark moved after every read, and a read returns what
the consumer has fetched: a loaded machine fetched in other sizes than the
failure-free reference run, and ``make demo-kafka``'s windowed proof saw
1,589 session records "missing" and 1,584 "unexpected" at load 30 (the same
events, judged late differently). Now a split's watermark moves at chunk
ends of ``job.batch_size`` records (``aiostream_ckpt.time.watermarks``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from aiostream_ckpt.daemon.app_loader import import_app
from aiostream_ckpt_dev.demo.kafka import load_jsonl
from tests.helpers import cli

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EVENTS = 20_000


async def test_tiny_fetches_give_the_same_sessions_and_late_events(
    tmp_path: Path, kafka_broker, new_topic, read_topic
) -> None:
    transitions = import_app("apps.transitions_per_hour")
    events = transitions.generate_events(EVENTS, users=40, max_delay=120_000, seed=11, step_ms=200)
    inp = transitions.write_events(tmp_path / "events.jsonl", events)
    topic = await new_topic(1)
    await load_jsonl(kafka_broker.bootstrap_servers, topic, inp)

    async def run(label: str, *extra: str) -> tuple[Counter[str], Counter[str]]:
        out, late = await new_topic(2), await new_topic(1)
        args = [
            "run", "apps.sessions",
            "--set", f"app.kafka_bootstrap={kafka_broker.bootstrap_servers}",
            "--set", f"app.input_topic={topic}",
            "--set", f"app.output_topic={out}",
            "--set", f"app.late_topic={late}",
            "--set", "app.stop_at_end=1",
            "--set", "app.gap=20000",
            "--set", "app.max_delay=60000",
            "--set", f"checkpoint.dir={tmp_path / label}",
            "--set", "job.batch_size=256",
            "--set", "rest.enabled=false",
        ]  # fmt: skip
        for s in extra:
            args += ["--set", s]
        done = cli(*args, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return Counter(map(str, await read_topic(out))), Counter(map(str, await read_topic(late)))

    whole_sessions, whole_late = await run("whole")
    tiny_sessions, tiny_late = await run("tiny", "app.fetch_bytes=1500")  # ~10 events a fetch
    assert sum(whole_late.values()) > 100, "the input must have late events to test anything"
    assert tiny_late == whole_late
    assert tiny_sessions == whole_sessions
