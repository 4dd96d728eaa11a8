"""The reference-run proof (``validate --app``): it finds planted faults and passes real runs.

The output under test is a real run of the app (the CLI, a separate process);
faults are planted by editing its committed files by hand, the way a broken
sink would leave them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt_dev.chaos.cli import run_chaos
from aiostream_ckpt_dev.validate.proof import (
    AppRun,
    compare_dirs,
    load_contract,
    output_files,
    plan_outputs,
    reference_run,
)
from aiostream_ckpt_dev.validate.proof_cli import proof_main, prove
from apps import transitions_per_hour as transitions
from tests.helpers import cli, make_pv_input

pytestmark = pytest.mark.integration

PV = load_contract("apps.pv_count")
EVENTS = 150_000


def _run_app(module: str, sets: list[str]) -> None:
    args = ["run", module, "--set", "rest.port=0"]
    for s in sets:
        args += ["--set", s]
    done = cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def pv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """A failure-free pv_count run (several committed files) and its reference twin."""
    d = tmp_path_factory.mktemp("pv")
    inp = make_pv_input(d / "in.jsonl", EVENTS, seed=3, keys=40, malformed=2)
    sets = [
        f"app.input={inp}",
        f"app.output={d / 'out'}",
        f"checkpoint.dir={d / 'ckpt'}",
        "checkpoint.interval=20ms",
        "job.batch_size=64",
    ]
    _run_app("apps.pv_count", sets)
    reference_run(AppRun("apps.pv_count", sets), PV, d / "ref")
    return d / "out", d / "ref" / "out-output", sets


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_unchanged_output_passes(pv_run: tuple[Path, Path, list[str]]) -> None:
    out, ref, _ = pv_run
    assert len(output_files(out)) > 2, "want output spread over several checkpoints"
    c = compare_dirs(out, ref, PV)
    assert c.passed, c.counts
    assert c.counts["records_out"] == c.counts["reference_records"] == EVENTS


def test_planted_duplicate_is_found(pv_run: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    out, ref, _ = pv_run
    bad = _copy(out, tmp_path / "out")
    files = output_files(bad)
    dup = _lines(files[0])[3]
    with open(files[-1], "ab") as f:
        f.write(dup)  # committed again by a later checkpoint
    c = compare_dirs(bad, ref, PV)
    assert not c.passed
    assert (c.counts["duplicated"], c.counts["missing"], c.counts["unexpected"]) == (1, 0, 0)
    ex = c.examples["duplicated"][0]
    assert ex["at"].startswith(files[-1].name) and ex["earlier_at"] == f"{files[0].name}:4"


def test_planted_loss_is_found(pv_run: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    out, ref, _ = pv_run
    bad = _copy(out, tmp_path / "out")
    victim = output_files(bad)[1]
    lines = _lines(victim)
    victim.write_bytes(b"".join(lines[:5] + lines[6:]))
    c = compare_dirs(bad, ref, PV)
    assert (c.counts["missing"], c.counts["duplicated"], c.counts["unexpected"]) == (1, 0, 0)
    assert c.examples["missing"][0]["record"].encode() + b"\n" == lines[5].replace(b" ", b"")


def test_planted_reorder_in_a_key_is_found(
    pv_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    out, ref, _ = pv_run
    bad = _copy(out, tmp_path / "out")
    files = output_files(bad)
    first, last = _lines(files[0]), _lines(files[-1])
    key = first[0].split(b'"pv"')[0]  # the record's app_id part
    j = next(i for i, ln in enumerate(last) if ln.startswith(key))
    first[0], last[j] = last[j], first[0]  # pv n committed before pv 1 of the same key
    files[0].write_bytes(b"".join(first))
    files[-1].write_bytes(b"".join(last))
    c = compare_dirs(bad, ref, PV)
    assert c.counts["reordered_keys"] == 1
    assert c.counts["duplicated"] == c.counts["missing"] == c.counts["unexpected"] == 0
    # the same records without a declared key: a multiset proof has nothing to say
    assert compare_dirs(bad, ref, ProofContract()).passed


def test_validate_app_cli_verdicts(
    pv_run: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _, sets = pv_run
    argv = ["--app", "apps.pv_count", "--scratch", str(tmp_path / "scratch")]
    for s in sets:
        argv += ["--set", s]
    assert proof_main(argv) == 0
    text = capsys.readouterr().out
    assert "dead-letter/events" in text and "records_out: 2" in text  # 2 malformed lines
    assert text.splitlines()[-1].startswith(f"validation: PASS output records_out={EVENTS}")
    bad = _copy(out, tmp_path / "bad")
    output_files(bad)[0].unlink()
    assert proof_main([*argv, "--output", str(bad)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("validation: FAIL")


def test_lost_dead_letters_are_found(pv_run: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    _, ref, sets = pv_run
    run = AppRun("apps.pv_count", [*sets, f"errors.dead_letter_dir={tmp_path / 'none'}"])
    plan = [p for p in plan_outputs(run, PV, ref.parent) if p.label == "dead-letter/events"]
    assert plan, "the reference's dead letters are compared even where the run has none"
    c = compare_dirs(plan[0].actual, plan[0].reference, PV)
    assert (c.counts["missing"], c.counts["reference_records"]) == (2, 2)


def test_app_without_declaration_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = proof_main(
        ["--app", "apps.running_sum", "--input", "x.jsonl", "--output", str(tmp_path)]
    )
    assert code == 2
    assert "declares no PROOF" in capsys.readouterr().err


def test_transitions_output_passes(tmp_path: Path) -> None:
    events = transitions.generate_events(6000, users=20, max_delay=120_000, seed=5, step_ms=3000)
    inp = transitions.write_events(tmp_path / "in.jsonl", events)
    sets = [
        f"app.input={inp}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "app.max_delay=120000",
        "checkpoint.interval=20ms",
        "job.batch_size=64",
    ]
    _run_app("apps.transitions_per_hour", sets)
    run = AppRun("apps.transitions_per_hour", sets)
    report = prove(run, load_contract(run.module), tmp_path / "scratch")
    assert report.passed, report.verdict_line()
    assert report.results[0].counts["records_out"] > 100


def test_session_window_output_passes(tmp_path: Path) -> None:
    events = transitions.generate_events(5000, users=30, max_delay=60_000, seed=8, step_ms=2000)
    inp = transitions.write_events(tmp_path / "in.jsonl", events)
    sets = [
        f"app.input={inp}",
        f"app.output={tmp_path / 'out'}",
        f"app.late_output={tmp_path / 'late'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "app.gap=20000",
        "checkpoint.interval=20ms",
        "job.batch_size=64",
    ]
    _run_app("apps.sessions", sets)
    run = AppRun("apps.sessions", sets)
    report = prove(run, load_contract(run.module), tmp_path / "scratch")
    assert report.passed, report.verdict_line()
    labels = [r.check for r in report.results]
    assert labels[:2] == ["output", "late_output"]
    assert report.results[0].counts["records_out"] > 100


@pytest.mark.spark
def test_spark_path_finds_the_same_faults(
    pv_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """One Spark run over an output with a planted duplicate, loss and reorder."""
    from aiostream_ckpt_dev.validate.proof import ComparedOutput
    from aiostream_ckpt_dev.validate.proof_spark import spark_results
    from aiostream_ckpt_dev.validate.session import get_spark

    out, ref, _ = pv_run
    bad = _copy(out, tmp_path / "out")
    files = output_files(bad)
    first, last = _lines(files[0]), _lines(files[-1])
    key = first[0].split(b'"pv"')[0]
    j = next(i for i, ln in enumerate(last) if ln.startswith(key))
    first[0], last[j] = last[j], first[0]  # reorder one key
    # the loss and the duplicate in other keys: a key whose records differ is not also
    # counted reordered. Which key opens files[1] depends on where the checkpoints cut
    # the output: it was the reordered one in a run (1 in 40 keys), reordered_keys 0.
    lost = _lines(files[1])
    drop = next(i for i, line in enumerate(lost) if not line.startswith(key))
    files[1].write_bytes(b"".join(lost[:drop] + lost[drop + 1 :]))  # lose one in another file
    files[0].write_bytes(b"".join(first))
    dup = next(line for line in first[1:] if not line.startswith(key))
    files[-1].write_bytes(b"".join([*last, dup]))  # duplicate one
    plan = [ComparedOutput("output", bad, ref), ComparedOutput("same", out, ref)]
    results = spark_results(get_spark(), plan, PV)
    fast = compare_dirs(bad, ref, PV)
    assert results[0].counts == fast.counts
    assert (fast.counts["duplicated"], fast.counts["missing"]) == (1, 1)
    assert fast.counts["reordered_keys"] >= 1
    assert results[0].examples["missing"][0]["canon"] == fast.examples["missing"][0]["record"]
    assert results[1].passed and results[1].counts["records_out"] == EVENTS


def test_a_nondeterministic_app_is_caught_not_blamed_on_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An app that repeats updates at random but declares PROOF: two reference runs differ."""
    inp = make_pv_input(tmp_path / "in.jsonl", 20_000, seed=4, keys=30)
    sets = [
        f"app.input={inp}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
    ]
    _run_app("tests.apps.random_repeats", sets)
    argv = ["--app", "tests.apps.random_repeats", "--scratch", str(tmp_path / "scratch")]
    for s in sets:
        argv += ["--set", s]
    assert proof_main(argv) == 1
    text = capsys.readouterr().out
    assert "[FAIL] determinism: output" in text
    assert "NOT DETERMINISTIC: two failure-free runs" in text
    assert "assumes: the app is deterministic (its PROOF declares it)" in text
    # the same app under chaos: refused before any kill, with the reason
    verdict = run_chaos(
        AppRun("tests.apps.random_repeats", sets),
        load_contract("tests.apps.random_repeats"),
        kills=2,
        seed=1,
        workdir=tmp_path / "chaos",
        echo=False,
    )
    assert verdict.kills == 0 and verdict.rounds == 0
    assert len(verdict.problems) == 1 and "NOT DETERMINISTIC" in verdict.problems[0]


def test_a_pass_states_what_it_assumes(
    pv_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    _, _, sets = pv_run
    run = AppRun("apps.pv_count", sets)
    report = prove(run, PV, tmp_path / "scratch")
    assert report.passed, report.verdict_line()
    twins = [r for r in report.results if r.check.startswith("determinism:")]
    assert [r.check for r in twins] == ["determinism: output", "determinism: dead-letter/events"]
    assert twins[0].counts["records_out"] == twins[0].counts["reference_records"] == EVENTS
    said = "\n".join(report.assumptions)
    assert "checked: a second failure-free run committed the same records" in said
    assert "each 'app_id''s records in commit order" in said
    one = prove(run, PV, tmp_path / "scratch1", reference_runs=1)
    assert one.passed and not any(r.check.startswith("determinism:") for r in one.results)
    assert "not checked: one reference run only" in "\n".join(one.assumptions)
