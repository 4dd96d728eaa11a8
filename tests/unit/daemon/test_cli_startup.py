"""What ``aiostream-ckpt run`` imports: each worker start pays for it, kill -9 tests many times.

aiokafka (~0.25 s of CPU) only for a job with Kafka in it, aiohttp (~0.4 s) only
with the REST API on. Before, building the command line imported aiokafka (for
the ``transactions`` command's options) and the daemon imported aiohttp even
with ``rest.enabled=false``: a tiny job's start took 1.0 s of CPU, now 0.55 s.
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
    r = subprocess.run(
        [sys.executable, "-c", CODE, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == loaded, r.stderr[-2000:]
