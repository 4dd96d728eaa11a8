"""One end-to-end pass of the bench on a tiny input: ours and the bare loop (subprocesses)."""

from pathlib import Path

import pytest

from bench.tests.cli_run import run_bench


@pytest.mark.integration
def test_quick_smoke_ours_and_bare_loop(tmp_path: Path) -> None:
    runs = run_bench(
        tmp_path,
        [
            "--quick",
            "--systems",
            "aiostream-ckpt,bare-loop",
            "--events",
            "50000",
            "--repeats",
            "1",
            "--no-recovery",
            "--no-latency",
        ],
    )
    for system in ("aiostream-ckpt", "bare-loop"):
        run = runs[(system, "embedded")]
        assert run["status"] == "ok", run
        assert run["exactly_once_verified"] is True
        assert run["events_per_s"] > 0
    assert runs[("bare-loop", "embedded")]["ratio_to_ours"]["events_per_s"] > 0
    assert runs[("aiostream-ckpt", "kafka")]["status"] == "unavailable"
