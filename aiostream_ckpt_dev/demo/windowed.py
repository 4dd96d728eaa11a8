"""The demos' second part: a windowed app under kill -9, proven against a failure-free run.

pv_count's check is a recount any reader can do; the windowed app's output
(sessions that merge across checkpoints, late events on a side output) has no
such shortcut, so the demos prove it the general way: ``aiostream-ckpt
chaos apps.sessions`` (:func:`aiostream_ckpt_dev.chaos.cli.run_chaos`), kills
at the checkpoint windows, every output compared with a failure-free run that
is itself run twice to check the app's determinism.
"""

from __future__ import annotations

import time
from pathlib import Path

from aiostream_ckpt.daemon.app_loader import import_app
from aiostream_ckpt_dev.chaos.cli import ChaosVerdict, run_chaos
from aiostream_ckpt_dev.validate.proof import AppRun, load_contract

APP = "apps.sessions"
#: Small: the demo's budget is minutes, and every kill restarts a worker process. Large
#: enough that a pass completes several checkpoints (:data:`CHECKPOINT_INTERVAL`) on a
#: fast, idle machine: the chaos plan may kill at the 3rd checkpoint's durable metadata,
#: and 30,000 events read in ~0.2 s completed 2 (3 rounds without a kill: FAIL, seed
#: 90426). Pacing or fetch sizes no longer matter to lateness: event time moves at
#: chunk ends of each split (``aiostream_ckpt.time.watermarks``).
EVENTS = 120_000
CHECKPOINT_INTERVAL = "50ms"
#: Out of order by up to 2 min, while the app waits 1 min: some events are late.
GENERATED_DELAY_MS, APP_DELAY_MS = 120_000, 60_000


def prove_windowed(
    label: str, work: Path, seed: int, *, kills: int = 2, kafka_bootstrap: str | None = None
) -> ChaosVerdict:
    """Run :data:`APP` under ``kills`` kill -9 in ``work``, print the proof's verdict; return it.

    With ``kafka_bootstrap``, Kafka to Kafka: the events go to an input topic
    of one partition (which events are late depends on the order they are
    read in), sessions and late events to topics of their own.
    """
    # the repo's apps/ is not installed: load it as `run` loads apps (the working directory)
    events_of = import_app("apps.transitions_per_hour")

    work.mkdir(parents=True, exist_ok=True)
    events = events_of.generate_events(
        EVENTS, users=50, max_delay=GENERATED_DELAY_MS, seed=seed, step_ms=200
    )
    inp = events_of.write_events(work / "events.jsonl", events)
    common = [
        "app.gap=20000",
        f"app.max_delay={APP_DELAY_MS}",
        f"checkpoint.interval={CHECKPOINT_INTERVAL}",
    ]
    if kafka_bootstrap is None:
        io = [
            f"app.input={inp}",
            f"app.output={work / 'output'}",
            f"app.late_output={work / 'late'}",
        ]
        where = "files"
    else:
        io = _kafka_io(kafka_bootstrap, inp, seed)
        where = "Kafka to Kafka"
    run = AppRun(APP, [*io, *common])
    print(
        f"{label}: windowed app {APP} (session windows, late events to a side output), "
        f"{EVENTS:,} events, {where}, SIGKILL x{kills} at checkpoint windows, proven against "
        "a failure-free run",
        flush=True,
    )
    started = time.monotonic()
    verdict = run_chaos(
        run, load_contract(APP), kills=kills, seed=seed, workdir=work / "chaos", echo=False
    )
    for problem in verdict.problems:
        print(f"{label}: problem: {problem}")
    for why in verdict.inconclusive:
        print(f"{label}: inconclusive: {why}")
    for assumption in verdict.assumptions:
        print(f"{label}: assumes: {assumption}")
    print(f"{label}: {verdict.line()} ({time.monotonic() - started:.0f}s)", flush=True)
    return verdict


def _kafka_io(bootstrap: str, inp: Path, seed: int) -> list[str]:
    """Create the topics, load the events; return the app params for Kafka mode."""
    import asyncio

    from aiostream_ckpt_dev.demo.kafka import create_topics, load_jsonl

    names = {k: f"sessions-{k}-{seed}" for k in ("in", "out", "late")}
    asyncio.run(create_topics(bootstrap, {names["in"]: 1, names["out"]: 2, names["late"]: 1}))
    asyncio.run(load_jsonl(bootstrap, names["in"], inp))
    return [
        f"app.kafka_bootstrap={bootstrap}",
        f"app.input_topic={names['in']}",
        f"app.output_topic={names['out']}",
        f"app.late_topic={names['late']}",
        "app.stop_at_end=1",
    ]


def verified_line(events: int, keys: int, restarts: int, windowed_kills: int) -> str:
    """Return the demos' last line on success (tests and the README look for it)."""
    windowed = f"; windowed app proven under {windowed_kills} kills" if windowed_kills else ""
    return f"exactly-once verified: {events} events, {keys} keys, {restarts} restarts{windowed}"
