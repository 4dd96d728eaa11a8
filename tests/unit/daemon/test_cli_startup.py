"""What ``aiostream-ckpt run`` imports: each worker start pays for it, kill -9 tests many times.

aiokafka (~0.25 s of CPU) only for a job with Kafka in it, aiohttp (~0.4 s) only
with the REST API on. Before, building the command line imported aiokafka (for
the ``transactions`` command's options) and the daemon imported aiohttp even
with ``rest.enabled=false``: a tiny job's start took 1.0 s of CPU, now 0.55 s.

With ``job.workers`` > 1 the main process only plans and coordinates the job:
declaring its Kafka source and sink imports no aiokafka there (the readers and
writers, in the workers, do), so the workers start that much sooner.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.helpers import REPO

CODE = """
import sys
from aiostream_ckpt.daemon.cli import main
code = main(sys.argv[1:])
print(sorted(m for m in ("aiokafka", "aiohttp") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize(("rest", "loaded"), [("false", "[]"), ("true", "['aiohttp']")])
def test_run_loads_kafka_and_http_only_when_the_job_uses_them(
    tmp_path: Path, rest: str, loaded: str
) -> None:
    events = tmp_path / "in.jsonl"
    events.write_bytes(b"".join(orjson.dumps({"key": k, "value": 1}) + b"\n" for k in "abca"))
    args = [
        "run", "apps.running_sum",
        "--set", f"app.input={events}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", f"rest.enabled={rest}",
        "--set", "rest.port=0",
    ]  # fmt: skip
    assert _loaded(CODE, args) == loaded


def _loaded(code: str, args: list[str]) -> str:
    """Run ``code`` with the command line ``args``; return what it printed (the modules)."""
    r = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip(), r.stderr[-2000:]
    return r.stdout.strip()


#: the main process of a workers-mode job, stopped where it would start its first worker
SPAWN = """
import asyncio, os, sys
from aiostream_ckpt.daemon.cli import main

async def spawn(*args, **kwargs):
    print(sorted(m for m in ("aiokafka", "aiohttp") if m in sys.modules), flush=True)
    os._exit(0)

asyncio.create_subprocess_exec = spawn
sys.exit(main(sys.argv[1:]))
"""


def test_the_main_process_of_a_kafka_job_in_workers_starts_them_without_aiokafka(
    tmp_path: Path,
) -> None:
    args = [
        "run", "apps.pv_count",
        "--set", "app.kafka_bootstrap=127.0.0.1:9",  # never reached: no reader, no writer here
        "--set", "app.input_topic=in",
        "--set", "app.output_topic=out",
        "--set", "app.key_grouped=1",
        "--set", "job.parallelism=2",
        "--set", "job.workers=2",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", "rest.enabled=false",
    ]  # fmt: skip
    assert _loaded(SPAWN, args) == "[]"
