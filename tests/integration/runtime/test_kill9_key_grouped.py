"""kill -9 and rescaling with key-grouped input read without a shuffle (``reinterpret_as_keyed``).

pv_count with ``app.key_grouped=1`` chains the count to the file source: a
restore must bring each file back to the subtask whose key groups its state
is in, at the same parallelism and at another one, or refuse clearly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import JobFailedError
from apps import pv_count
from apps.pv_count import app_id
from tests.helpers import check_pv_output, cli, recount

pytestmark = pytest.mark.integration


def _key_grouped_input(tmp_path: Path, events: int, parts: int) -> list[Path]:
    records = ({"app_id": f"app-{(i * 7919) % 300}", "seq": i} for i in range(events))
    return write_key_grouped(records, app_id, tmp_path / "in", parts=parts)


def test_kill9_and_restores_at_2_then_1_read_each_file_where_its_state_is(
    tmp_path: Path,
) -> None:
    files = _key_grouped_input(tmp_path, 200_000, parts=2)
    out = tmp_path / "out"

    def settings(parallelism: int) -> dict[str, str]:
        return {
            "app.input": ",".join(map(str, files)),
            "app.output": str(out),
            "app.key_grouped": "1",
            "checkpoint.dir": str(tmp_path / "ckpt"),
            "checkpoint.interval": "20ms",
            "job.parallelism": str(parallelism),
            "job.batch_size": "128",
            "rest.enabled": "false",
            "restart.strategy": "none",
        }

    def run(parallelism: int, env: dict[str, str] | None = None) -> tuple[int, str]:
        sets = settings(parallelism)
        args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        done = cli("run", "apps.pv_count", *args, env=env)
        return done.returncode, done.stderr

    # parallelism 2, SIGKILLed right after its 2nd checkpoint is durable
    code, log = run(2, {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"})
    assert code == -9, log[-2000:]
    committed_before = sorted(p.name for p in out.glob("part-*"))
    # parallelism 4 would split a file's key groups over two subtasks: refused, nothing
    # changed (run in this process, as the CLI would: same config, same runner)
    loaded = load_config(sets=[f"{k}={v}" for k, v in settings(4).items()])
    env = StreamEnvironment("pv_count", config=loaded.job, params=loaded.params)
    pv_count.build(env)
    with pytest.raises(JobFailedError) as refused:
        env.execute()
    text = str(refused.value)
    assert "not retriable" in text and "subtasks 0-1 of parallelism 4" in text, text
    assert "run at parallelism 1, 2" in text
    assert sorted(p.name for p in out.glob("part-*")) == committed_before
    # parallelism 2 again, from that checkpoint: SIGKILLed after 2 more
    code, log = run(2, {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"})
    assert code == -9, log[-2000:]
    assert "restor" in log
    # parallelism 1 holds every key group: both files, with both subtasks' state
    code, log = run(1)
    assert code == 0, log[-2000:]
    check = check_pv_output(out, recount(*files))
    assert check.exact and check.records == 200_000, check.gaps[:3]
