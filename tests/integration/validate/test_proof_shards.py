"""``validate --app`` over a sharded job's output: every shard's files against one reference.

Two daemons (``--shard 0/2``, ``1/2``) write pv_count's output into
``out/shard-I-of-2``; the proof runs the job once, unsharded, as its
reference and compares it with the union of the shards' committed files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from aiostream_ckpt_dev.validate.proof import output_files
from aiostream_ckpt_dev.validate.proof_cli import proof_main
from apps.pv_count import app_id
from tests.helpers import cli

pytestmark = pytest.mark.integration

EVENTS = 20_000


def test_validate_app_reads_every_shards_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = ({"app_id": f"app-{(i * 7919) % 60}", "seq": i} for i in range(EVENTS))
    files = write_key_grouped(records, app_id, tmp_path / "in", parts=2)
    sets = [
        f"app.input={','.join(map(str, files))}",
        f"app.output={tmp_path / 'out'}",
        "app.key_grouped=1",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "checkpoint.interval=20ms",
        "job.batch_size=128",
    ]
    flags = [a for s in sets for a in ("--set", s)]
    for shard in ("0/2", "1/2"):
        done = cli("run", "apps.pv_count", "--shard", shard, "--set", "rest.enabled=false", *flags)
        assert done.returncode == 0, done.stderr[-2000:]
    found = output_files(tmp_path / "out")
    assert {p.parent.name for p in found} == {"shard-0-of-2", "shard-1-of-2"}
    argv = ["--app", "apps.pv_count", "--scratch", str(tmp_path / "scratch"), *flags]
    assert proof_main(argv) == 0, capsys.readouterr().out[-3000:]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"validation: PASS output records_out={EVENTS}"), last
    # a shard's files lost: the proof sees it
    for path in found:
        if path.parent.name == "shard-1-of-2":
            path.unlink()
    assert proof_main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("validation: FAIL")
