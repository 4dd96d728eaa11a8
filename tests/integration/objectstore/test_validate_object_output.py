"""``validate --app`` proves an output that lives in the object store."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore, S3Settings
from aiostream_ckpt_dev.s3server import SeaweedS3
from aiostream_ckpt_dev.validate.proof_cli import proof_main
from tests.helpers import cli, make_pv_input

pytestmark = pytest.mark.integration

EVENTS = 40_000


def test_validate_app_reads_the_store(
    s3_server: SeaweedS3, s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, seed=5, keys=40)
    sets = [
        f"app.input={inp}",
        f"app.output={s3_prefix}/out",
        f"checkpoint.dir={s3_prefix}/ckpt",
        f"checkpoint.local_dir={tmp_path / 'local'}",
        "checkpoint.interval=50ms",
        "job.batch_size=64",
    ]
    done = cli(
        "run",
        "apps.pv_count",
        "--set",
        "rest.enabled=false",
        *(a for s in sets for a in ("--set", s)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    argv = ["--app", "apps.pv_count", "--scratch", str(tmp_path / "scratch")]
    for s in sets:
        argv += ["--set", s]
    assert proof_main(argv) == 0
    text = capsys.readouterr().out
    assert "(committed objects)" in text
    assert text.splitlines()[-1].startswith(f"validation: PASS output records_out={EVENTS}")

    # a planted duplicate: one committed object again under a later checkpoint's name
    location = ObjectLocation.parse(f"{s3_prefix}/out")
    store = ObjectStore(S3Settings(), location.bucket)
    first = min(k for k, _ in store.list_keys(location.key("part-")))
    store.put_bytes(location.key("part-9999999999-0000.jsonl"), store.get_bytes(first)[0])
    assert proof_main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("validation: FAIL")
