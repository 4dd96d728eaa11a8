"""Fallbacks to older checkpoints keep the output contract (kill -9, corrupted files).

Choose, verify every task's state, then let sinks recover; a bad checkpoint
is set aside on disk for good; committed output is never rewritten or
renamed into, only moved aside with a manifest.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.connectors.staging import committed_files, read_committed_output
from tests.helpers import REPO, check_pv_output, cli, cli_cmd, make_pv_input, recount
from tests.integration.runtime.failover.test_recovery import run_until_checkpoint

pytestmark = pytest.mark.integration


def args_for(tmp_path: Path, inp: Path, *extra: str) -> list[str]:
    return [
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", "checkpoint.interval=30ms",
        "--set", "job.batch_size=256",
        "--set", "job.name=pv_count",
        *extra,
    ]  # fmt: skip


def digests(directory: Path, prefix: str = "part") -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in committed_files(directory, prefix=prefix)
    }


def completed_dirs(ckpt: Path) -> list[Path]:
    """Completed checkpoints, not the ones set aside (``chk-N.bad``)."""
    return sorted(c for c in ckpt.glob("chk-??????????") if (c / "_metadata").exists())


def test_corrupt_shared_state_falls_back_and_retracts_aside(tmp_path: Path) -> None:
    """Both retained checkpoints build on one corrupt full file: every sink waits for verification.

    On main the sinks and the dead-letter writer recovered (deleting output)
    before the state failed its checksum, and with no valid checkpoint left the
    job stopped: "output directory already has committed output".
    """
    gen = make_pv_input(tmp_path / "gen.jsonl", 400_000)
    inp = tmp_path / "in.jsonl"  # malformed lines first: dead letters committed before the kill
    inp.write_bytes(b'{"app_id": broken 1\nnot json\n{"app_id": 7}\n' + gen.read_bytes())
    args = args_for(
        tmp_path, inp,
        "--set", "job.parallelism=2",
        "--set", "checkpoint.retained=2",
        "--set", "checkpoint.full_every=1000",
        "--set", "checkpoint.max_delta_ratio=0",
    )  # fmt: skip
    run_until_checkpoint(cli_cmd("run", "apps.pv_count", *args), 6)
    out, dead = tmp_path / "out", tmp_path / "ckpt" / "dead-letter" / "events"
    before = digests(out)
    dead_before = digests(dead, "dead-letter")
    assert before and dead_before, "the killed run committed output and dead letters"
    newest = completed_dirs(tmp_path / "ckpt")[-1]
    chk = read_checkpoint(newest)
    base = chk.operators["pv-count"]["subtasks"]["1"]["keyed"]["chain"][0]
    assert base["kind"] == "full"
    victim = tmp_path / "ckpt" / base["path"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    ids_before = [int(c.name.split("-")[1]) for c in completed_dirs(tmp_path / "ckpt")]

    r = cli("run", "apps.pv_count", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    check = check_pv_output(out, recount(inp))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
    assert len(list(read_committed_output(dead, prefix="dead-letter"))) == 3
    # committed output was moved aside, never rewritten: no name is used twice
    after = digests(out)
    for name in set(after) & set(before):
        assert after[name] == before[name], f"{name} was rewritten"
    retracted = list((out / "_retracted").rglob("part-*.jsonl"))
    assert {p.name for p in retracted} == set(before) - set(after)
    assert not set(after) & {p.name for p in retracted}, "a retracted name was used again"
    manifests = list((out / "_retracted").rglob("_manifest-*.json"))
    assert manifests
    listed = [e for m in manifests for e in orjson.loads(m.read_bytes())["what"]]
    assert sorted(e["file"] for e in listed) == sorted(p.name for p in retracted)
    warned = [
        int(m.group(1))
        for m in re.finditer(r"WARNING.*?/out: retracted (\d+) committed record\(s\)", r.stderr)
    ]
    assert warned and sum(warned) == sum(e["records"] for e in listed) > 0
    # both bad checkpoints are set aside on disk, listed with their reason; ids only grew
    listing = cli("checkpoints", "list", str(tmp_path / "ckpt"))
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.count("set aside:") == len(ids_before) and "sha256" in listing.stdout
    new_ids = [int(c.name.split("-")[1]) for c in completed_dirs(tmp_path / "ckpt")]
    assert new_ids and min(new_ids) > max(ids_before)


def test_checkpoint_set_aside_once_is_never_chosen_again(tmp_path: Path) -> None:
    """Metadata unreadable for one restart, readable again later: the checkpoint stays aside.

    On main the bad set lived in memory: the first restart fell back and
    discarded the newest checkpoint's staged files, the next one picked that
    checkpoint again and failed for good ("pre-committed file ... is missing").
    """
    inp = make_pv_input(tmp_path / "in.jsonl", 300_000)
    args = args_for(tmp_path, inp, "--set", "checkpoint.retained=3")
    run_until_checkpoint(cli_cmd("run", "apps.pv_count", *args), 4)
    newest = completed_dirs(tmp_path / "ckpt")[-1]
    good = (newest / "_metadata").read_bytes()
    (newest / "_metadata").write_bytes(good[:10] + bytes([good[10] ^ 0xFF]) + good[11:])
    # the restart falls back, recovers the sink, then dies before any new checkpoint
    flaky = cli(
        "run", "tests.apps.flaky_count",
        *args,
        "--set", "checkpoint.interval=1h",
        "--set", "app.fail_at=299999",
        "--set", "app.always_fail=1",
        "--set", f"app.marker={tmp_path / 'marker'}",
        "--set", "restart.strategy=none",
    )  # fmt: skip
    assert flaky.returncode == 1 and "injected failure" in flaky.stderr, flaky.stderr[-3000:]
    assert "falling back" in flaky.stderr or "set aside" in flaky.stderr
    # the metadata is readable again wherever the checkpoint now lives
    where = newest if newest.exists() else newest.with_name(newest.name + ".bad")
    (where / "_metadata").write_bytes(good)
    r = cli("run", "apps.pv_count", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_pv_output(tmp_path / "out", recount(inp)).exact
    cid = int(newest.name.split("-")[1])
    listing = cli("checkpoints", "list", str(tmp_path / "ckpt")).stdout
    assert any(
        line.split()[0] == str(cid) and "set aside:" in line and "checksum" in line
        for line in listing.splitlines()
    ), listing
    inspected = cli("checkpoints", "inspect", str(tmp_path / "ckpt"), str(cid))
    assert inspected.returncode != 0
    assert f"checkpoint {cid} was set aside as bad: " in inspected.stderr, inspected.stderr


def test_kill9_right_after_a_retraction_then_resume(tmp_path: Path) -> None:
    """kill -9 during recovery itself: after output was moved aside, before a new checkpoint."""
    inp = make_pv_input(tmp_path / "in.jsonl", 400_000)
    args = args_for(
        tmp_path, inp,
        "--set", "checkpoint.retained=2",
        "--set", "checkpoint.full_every=1000",
        "--set", "checkpoint.max_delta_ratio=0",
    )  # fmt: skip
    run_until_checkpoint(cli_cmd("run", "apps.pv_count", *args), 5)
    newest = completed_dirs(tmp_path / "ckpt")[-1]
    base = read_checkpoint(newest).operators["pv-count"]["subtasks"]["0"]["keyed"]["chain"][0]
    victim = tmp_path / "ckpt" / base["path"]
    victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    before = digests(tmp_path / "out")
    proc = subprocess.Popen(
        cli_cmd("run", "apps.pv_count", *args, "--set", "checkpoint.interval=1h"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.stderr is not None
    for raw in proc.stderr:
        if b"committed record(s)" in raw:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the restart retracted nothing"
    r = cli("run", "apps.pv_count", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_pv_output(tmp_path / "out", recount(inp)).exact
    after = digests(tmp_path / "out")
    assert all(after[n] == before[n] for n in set(after) & set(before)), "a file was rewritten"
    moved = {p.name for p in (tmp_path / "out" / "_retracted").rglob("part-*.jsonl")}
    assert moved == set(before) - set(after) and not moved & set(after)
