"""The workers rows' steady rate: the job's pace is its slowest reader's, not the sum's."""

from pathlib import Path

import pytest

from bench import runner
from bench.monitor import ProcessRecord, _Progress
from bench.stats import slowest_reader, steady_window
from bench.systems import Attempt, RunSpec, System, Workload
from bench.validation import Verdict

SIZE = 1000.0


def _two_workers(fast: float = 250.0, slow: float = 200.0) -> ProcessRecord:
    """Two readers of 1000 bytes each from t=1 s: one at ``fast`` B/s, one at ``slow``.

    The fast one is done at 5 s, the slow one at 6 s: until 5 s the sum rises at
    450 B/s, after it at 200 B/s; the job takes 5 s for 2000 bytes, 400 B/s.
    """
    rec = ProcessRecord(cmd=["fake"], exit_code=0, wall_s=6.5)
    for i in range(1, 121):
        t = 0.05 * i
        a, b = (min(SIZE, max(0.0, r * (t - 1.0))) for r in (fast, slow))
        rec.positions.append((t, a + b))
        rec.reader_positions.append((t, (a, b)))
    return rec


class _Replay(System):
    name = "aiostream-ckpt"

    def __init__(self, rec: ProcessRecord) -> None:
        self.rec = rec

    def run(self, spec: RunSpec) -> Attempt:
        return Attempt(self.rec, spec.out_dir, {}, "none", {}, [(3.0, 1, 50.0, 100)])


def _workload(tmp_path: Path) -> Workload:
    paths = []
    for i in range(2):
        p = tmp_path / f"in{i}.jsonl"
        p.write_bytes(b"x" * int(SIZE))
        paths.append(p)
    return Workload(tuple(paths), 2000, 10, 1, 0.0, 0)


def test_summed_positions_flatter_a_job_whose_readers_end_apart() -> None:
    rec = _two_workers()
    summed = steady_window(rec.positions, 2 * SIZE)
    paced = steady_window(slowest_reader(rec.reader_positions, [SIZE, SIZE]), 2 * SIZE)
    assert summed is not None and paced is not None
    # the sum's 90 % comes when the fast reader ends: the slow one's lone tail is left out
    assert summed.rate == pytest.approx(450.0)
    assert paced.rate == pytest.approx(400.0)  # the job's 2000 bytes in 5 s


def test_measure_reports_the_slowest_readers_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "wait_for_quiet", lambda **_: 0.0)
    wl = _workload(tmp_path)
    m = runner.measure(
        _Replay(_two_workers()),
        wl,
        tmp_path / "work",
        experiment="workers=2 test",
        repeats=1,
        check=lambda _i, _o: Verdict("python", True),
        keep_outputs=False,
        parallel_readers=True,
    )
    r = m.result
    assert r.status == "ok"
    # 2000 events in 2000 bytes: 1 event per byte
    assert r.events_per_s == pytest.approx(400.0)
    assert r.config["steady_summed_events_per_s"] == [450]
    seconds, checkpoints = r.config["steady_windows"][0]
    assert checkpoints == 1 and seconds == pytest.approx(4.0, abs=0.06)


def test_progress_keeps_each_files_position(tmp_path: Path) -> None:
    import os

    wl = _workload(tmp_path)
    progress = _Progress(wl.paths)
    with open(wl.paths[0], "rb") as a, open(wl.paths[1], "rb") as b:
        a.seek(300)
        b.seek(700)
        assert progress.sample(os.getpid()) == 1000.0
        assert progress.per_file() == (300.0, 700.0)


def test_kafka_output_is_paced_by_its_slowest_partition() -> None:
    from bench.kafka import slowest_partition_window

    # worker 0 writes partitions 0, 1 at 250 records/s each, worker 1 partitions 2, 3 at
    # 200/s: 1000 records each, worker 0 done at 4 s, worker 1 at 5 s
    per_partition = [
        (0.05 * i, tuple(min(1000.0, r * 0.05 * i) for r in (250.0, 250.0, 200.0, 200.0)))
        for i in range(121)
    ]
    summed = [(t, sum(parts)) for t, parts in per_partition]
    assert steady_window(summed, 4000.0).rate == pytest.approx(900.0)  # type: ignore[union-attr]
    paced = slowest_partition_window(per_partition, 4000)
    assert paced is not None and paced.rate == pytest.approx(800.0)  # 4000 in 5 s
