"""``aiostream-ckpt chaos MODULE``: kill -9 across the dangerous windows, then prove the output.

1. Run the app once failure-free, embedded, as the reference (:mod:`.proof`).
2. Rounds, each on fresh checkpoint and output directories: run the app as
   a worker process under a plan of kills aimed at the windows of
   :mod:`aiostream_ckpt_dev.chaos.windows` (fail points and input
   position), with ``faults`` also those of
   :mod:`aiostream_ckpt_dev.chaos.faults` between restarts, until it
   finishes, then compare each declared output and the dead letters with the
   reference; with ``--oracle``, also the main output with the app's
   independent recount from the input (in Kafka mode from the input topics,
   read once; an oracle that cannot run is a FAIL before any round).
3. Until ``--kills`` kills happened, print one verdict line::

       chaos: kills=N faults=F events=E lost=L duplicated=D verdict=PASS|FAIL|INCONCLUSIVE

``lost`` and ``duplicated`` add up every round and output; unexpected or
reordered records or a worker that failed FAIL (exit 1). A run that could
not test what was asked, fewer kills than ``--kills`` because the input ran
out first, is INCONCLUSIVE (exit 3), with what to change: that says
nothing about the engine. ``events`` counts every input the app's PROOF
names (``ProofContract.inputs``; the input topics in Kafka mode).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.errors import AiostreamError
from aiostream_ckpt_dev.chaos.faults import plan_faults
from aiostream_ckpt_dev.chaos.windows import plan_round, run_round
from aiostream_ckpt_dev.validate.proof import (
    DETERMINISM,
    AppRun,
    assumptions,
    compare_dirs,
    compare_oracle,
    kafka_bootstrap,
    load_contract,
    plan_outputs,
    record_topics,
    reference_run,
    reference_topics,
    twin_outputs,
)
from aiostream_ckpt_dev.validate.proof_cli import add_reference_runs
from aiostream_ckpt_dev.validate.proof_kafka import (
    KafkaTopic,
    app_topic,
    drop_topics,
    new_twin,
    record_span,
    write_values,
)


@dataclass
class ChaosVerdict:
    """What all rounds of one chaos run add up to."""

    kills: int = 0
    events: int = 0
    rounds: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    windows: Counter[str] = field(default_factory=Counter)
    #: faults injected between restarts (:mod:`aiostream_ckpt_dev.chaos.faults`), by kind
    faults: Counter[str] = field(default_factory=Counter)
    #: committed records the fallbacks after a corruption moved aside (retracted)
    retracted: int = 0
    problems: list[str] = field(default_factory=list)
    #: why the run could not test what was asked (no engine failure; ``problems`` win)
    inconclusive: list[str] = field(default_factory=list)
    #: what the verdict rests on (see :func:`~aiostream_ckpt_dev.validate.proof.assumptions`)
    assumptions: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems and not self.inconclusive

    @property
    def word(self) -> str:
        """PASS, FAIL (a problem found) or INCONCLUSIVE (nothing found, too little tested)."""
        return "FAIL" if self.problems else "INCONCLUSIVE" if self.inconclusive else "PASS"

    def add(self, other: ChaosVerdict) -> None:
        self.kills += other.kills
        self.events += other.events
        self.rounds += other.rounds
        self.counts.update(other.counts)
        self.windows.update(other.windows)
        self.faults.update(other.faults)
        self.retracted += other.retracted
        self.problems += other.problems
        self.inconclusive += other.inconclusive
        self.assumptions += [a for a in other.assumptions if a not in self.assumptions]

    def line(self) -> str:
        c = self.counts
        return (
            f"chaos: kills={self.kills} faults={self.faults.total()} events={self.events} "
            f"lost={c['missing']} duplicated={c['duplicated']} "
            f"verdict={self.word}"
        )

    def details(self) -> str:
        c = self.counts
        windows = " ".join(f"{w}={n}" for w, n in sorted(self.windows.items()))
        faults = " ".join(f"{f}={n}" for f, n in sorted(self.faults.items())) or "none"
        return (
            f"chaos: {self.rounds} rounds; kills by window: {windows}; faults: {faults} "
            f"(retracted {self.retracted} committed records); unexpected="
            f"{c['unexpected']} reordered_keys={c['reordered_keys']} "
            f"malformed_out={c['malformed_out']}"
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aiostream-ckpt chaos", description=__doc__.split("\n")[0])
    p.add_argument("module", help="app module (apps.pv_count) or file")
    p.add_argument("--config", type=Path)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--seed", type=int, default=None, help="default: random")
    p.add_argument("--kills-per-round", type=int, default=8)
    p.add_argument("--workdir", type=Path, default=Path(".chaos"))
    p.add_argument("--oracle", action="store_true", help="also check the app's own recount")
    p.add_argument("--deterministic", action="store_true", help="assert it (app without PROOF)")
    p.add_argument("--keep", action="store_true", help="keep every round's directories")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per round")
    add_reference_runs(p)
    return p


def run_chaos(
    run: AppRun,
    contract: ProofContract,
    *,
    kills: int,
    seed: int,
    workdir: Path,
    kills_per_round: int = 8,
    oracle: bool = False,
    keep: bool = False,
    timeout: float = 900.0,
    echo: bool = True,
    faults: bool = False,
    reference_runs: int = 2,
    hangs: bool = False,
    delta: bool = False,
) -> ChaosVerdict:
    """Run rounds of planned kills until ``kills`` happened; prove each against one reference.

    With ``faults``, each round also injects the faults of
    :func:`~aiostream_ckpt_dev.chaos.faults.plan_faults` between its restarts.
    With ``reference_runs=2`` a second failure-free run must commit what the
    first did, or no round runs: the proof assumes a deterministic app.
    With ``hangs`` (``job.workers`` > 1), the kills between a round's first and
    its end-of-input ones SIGSTOP a worker instead (:data:`.windows.HANG`).
    ``delta``: the app writes a Delta table; the plans take its windows too.
    """
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    reference = workdir / "reference"
    plan_outputs(run, contract, reference)  # fails early when the main output is not set
    verdict = ChaosVerdict()
    kafka = _kafka(run, contract)
    workers = _workers(run)
    refused = oracle_refusal(contract, kafka) if oracle else None
    if refused is not None:  # asked for and cannot run: a FAIL, before any work
        verdict.problems.append(f"oracle: not run — {refused}")
        return verdict
    ref_seconds = reference_run(run, contract, reference)
    oracle_params = _oracle_params(run, contract, kafka, workdir) if oracle else None
    verdict.assumptions = assumptions(contract, reference_runs, oracle=oracle_params is not None)
    if reference_runs > 1:
        second = workdir / "reference-2"
        reference_run(run, contract, second)
        _check_twins(verdict, run, contract, reference, second)
        if not keep:
            _drop(second)
    stalled = 0
    while verdict.kills < kills and not verdict.problems and not verdict.inconclusive:
        r = verdict.rounds
        verdict.rounds += 1
        rdir = workdir / f"round-{r}"
        shutil.rmtree(rdir, ignore_errors=True)
        rdir.mkdir(parents=True)
        rrun = _round_run(run, contract, rdir, kafka)
        want = min(kills_per_round, kills - verdict.kills)
        plan = plan_round(
            rng,
            want,
            position=bool(rrun[1]),
            workers=workers,
            hangs=hangs,
            unaligned=_unaligned(run),
            delta=delta,
        )
        cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", run.module]
        if run.config is not None:
            cmd += ["--config", str(run.config)]
        for s in [*rrun[0].sets, "rest.port=0"]:
            cmd += ["--set", s]
        result = run_round(
            cmd,
            plan,
            inputs=rrun[1],
            log_path=rdir / "worker.log",
            timeout=timeout,
            faults=plan_faults([k.window for k in plan]) if faults else None,
            checkpoint_dir=rdir / "checkpoints",
            workers=workers,
        )
        verdict.kills += result.kill_count
        verdict.windows.update(result.kills)
        verdict.faults.update(result.faults)
        verdict.retracted += result.retracted
        events = _events(rrun[1]) if kafka is None else _topic_events(run, contract)
        verdict.events += events
        verdict.problems += [f"round {r}: {p}; see {rdir / 'worker.log'}" for p in result.problems]
        if result.exit_code != 0:
            verdict.problems.append(
                f"round {r}: worker exited {result.exit_code}; see {rdir / 'worker.log'}"
            )
            break
        stalled = stalled + 1 if result.kill_count == 0 else 0
        if stalled >= 3:
            verdict.inconclusive.append(
                f"3 rounds in a row ended before any kill: the input ({events} events) is "
                f"read before the first planned kill. {_more_input(events, run, contract)}"
            )
        prove_round(verdict, f"round {r}", rrun[0], contract, reference, oracle_params)
        if echo:
            print(
                f"chaos round {r}: {result.kill_count} kills "
                f"({', '.join(f'{w}={n}' for w, n in sorted(result.kills.items()))}), "
                f"{result.runs} runs in {result.elapsed:.1f}s; "
                f"{'ok' if not verdict.problems else verdict.problems[-1]}",
                flush=True,
            )
        if not keep and not verdict.problems:
            _drop(rdir)
    if verdict.kills < kills and not verdict.problems and not verdict.inconclusive:
        verdict.inconclusive.append(
            f"only {verdict.kills} of {kills} kills happened. "
            f"{_more_input(verdict.events, run, contract)}"
        )
    if echo:
        print(f"chaos: reference run took {ref_seconds:.1f}s", flush=True)
    if not keep:
        _drop(reference)
    return verdict


def _check_twins(
    verdict: ChaosVerdict, run: AppRun, contract: ProofContract, first: Path, second: Path
) -> None:
    for twin in twin_outputs(run, contract, first, second):
        c = compare_dirs(twin.actual, twin.reference, contract)
        if not c.passed:
            bad = {k: c.counts[k] for k in _FAILURES if c.counts[k]}
            first_example = next(iter(c.examples.values()), [])[:1]
            verdict.problems.append(
                f"{twin.label.removeprefix(DETERMINISM).strip()}: the app is NOT DETERMINISTIC: "
                f"two failure-free runs differ ({bad}; e.g. {first_example}), so comparing "
                "with a reference proves nothing for it"
            )


def oracle_refusal(contract: ProofContract, kafka: str | None) -> str | None:
    """Say why the app's oracle cannot check the run (``kafka``: its bootstrap), or None."""
    if contract.oracle is None:
        return "the app's PROOF declares no oracle"
    if kafka is None:
        return None
    if not contract.kafka_inputs:
        return "Kafka mode, and the app's PROOF names no kafka_inputs to read the input from"
    if contract.kafka_oracle_input is None:
        return (
            "Kafka mode, and the app's PROOF names no kafka_oracle_input (the param its oracle "
            "reads input files from)"
        )
    return None


def _oracle_params(
    run: AppRun, contract: ProofContract, kafka: str | None, workdir: Path
) -> dict[str, Any]:
    """Return the params the oracle recounts from: the run's, in Kafka mode its input as files.

    The input topics stay as they are for the whole run (each round only
    writes fresh output topics), so they are read once.
    """
    from aiostream_ckpt.daemon.config import load_config

    params = dict(load_config(run.config, env=os.environ, sets=run.sets).params)
    if kafka is None:
        return params
    assert contract.kafka_oracle_input is not None
    files = []
    for p in contract.kafka_inputs:
        if p in params:
            path = workdir / f"oracle-input-{p}.jsonl"
            write_values(app_topic(contract, params, kafka, p), path)
            files.append(str(path))
    params[contract.kafka_oracle_input] = ",".join(files)
    return params


def _workers(run: AppRun) -> int:
    from aiostream_ckpt.daemon.config import load_config

    return load_config(run.config, env=os.environ, sets=run.sets).job.workers


def _unaligned(run: AppRun) -> bool:
    from aiostream_ckpt.daemon.config import load_config

    return load_config(run.config, env=os.environ, sets=run.sets).job.checkpoint.unaligned


def _kafka(run: AppRun, contract: ProofContract) -> str | None:
    from aiostream_ckpt.daemon.config import load_config

    return kafka_bootstrap(contract, load_config(run.config, env=os.environ, sets=run.sets).params)


def _round_run(
    run: AppRun, contract: ProofContract, rdir: Path, kafka: str | None
) -> tuple[AppRun, list[Path]]:
    """Return the run with this round's directories (or topics), and its input files."""
    from aiostream_ckpt.daemon.config import load_config

    loaded = load_config(run.config, env=os.environ, sets=run.sets)
    sets = [
        *run.sets,
        f"checkpoint.dir={rdir / 'checkpoints'}",
        f"errors.dead_letter_dir={rdir / 'dead-letter'}",
    ]
    if kafka is not None:
        # each round writes fresh topics like the app's own; listed for the cleanup
        topics = {
            p: new_twin(app_topic(contract, loaded.params, kafka, p), f"chaos-{rdir.name}")
            for p in contract.kafka_outputs
            if p in loaded.params
        }
        record_topics(rdir, kafka, topics)
        sets += [f"app.{p}={t.topic}" for p, t in topics.items()]
        return AppRun(run.module, sets, run.config), []
    sets += [f"app.{p}={rdir / f'out-{p}'}" for p in contract.outputs if p in loaded.params]
    inputs = [
        path
        for param in contract.inputs
        for s in str(loaded.params.get(param, "")).split(",")
        if s and (path := Path(s)).is_file()
    ]
    return AppRun(run.module, sets, run.config), inputs


def _topic_events(run: AppRun, contract: ProofContract) -> int:
    """Count the input topics' records (loaded without transactions: their offset span)."""
    from aiostream_ckpt.daemon.config import load_config

    params = load_config(run.config, env=os.environ, sets=run.sets).params
    bootstrap = kafka_bootstrap(contract, params)
    assert bootstrap is not None
    return sum(
        record_span(KafkaTopic(bootstrap, str(params[p])))
        for p in contract.kafka_inputs
        if p in params
    )


def _more_input(events: int, run: AppRun, contract: ProofContract) -> str:
    """Say what to change when the input ran out before the kills did."""
    if events == 0:
        names = ", ".join(f"app.{p}" for p in (contract.kafka_inputs or contract.inputs))
        return (
            f"No input events were found: set the app's inputs ({names}) to files or topics "
            "that hold records (the PROOF's `inputs` names the params chaos counts)"
        )
    return (
        "Give a larger input (10x as many events), slow the source down if the app has a "
        "rate parameter (e.g. --set app.rate=...), shorten checkpoint.interval, or ask for "
        "fewer --kills"
    )


def _drop(directory: Path) -> None:
    """Remove a reference's or round's directory and the topics it made."""
    drop_topics([*reference_topics(directory).values()])
    shutil.rmtree(directory, ignore_errors=True)


def _events(inputs: list[Path]) -> int:
    n = 0
    for path in inputs:
        with open(path, "rb") as f:
            n += sum(1 for line in f if line.strip())
    return n


def prove_round(
    verdict: ChaosVerdict,
    label: str,
    run: AppRun,
    contract: ProofContract,
    reference: Path,
    oracle_params: dict[str, Any] | None,
) -> None:
    """Compare the round's outputs with the reference (and the main one with the oracle).

    Counts add up over outputs; for the main output, each count is the larger
    of the reference's and the oracle's, so that a loss both runs share (a bug
    the reference repeats) still counts. ``oracle_params``: what the oracle
    recounts from (None: no oracle).
    """
    outputs = plan_outputs(run, contract, reference)
    compared = [(out.label, compare_dirs(out.actual, out.reference, contract)) for out in outputs]
    main_counts = Counter(compared[0][1].counts)
    if oracle_params is not None and contract.oracle is not None:
        # outputs[0] is the main output of this round: its directory or its topic
        recount = compare_oracle(outputs[0].actual, contract.oracle(oracle_params), contract)
        compared.append(("oracle recount", recount))
        main_counts |= Counter(recount.counts)  # per-key maximum
    for i, (name, c) in enumerate(compared):
        if i == 0:
            verdict.counts.update({k: main_counts[k] for k in _FAILURES})
        elif name != "oracle recount":
            verdict.counts.update({k: c.counts[k] for k in _FAILURES})
        if not c.passed:
            bad = {k: c.counts[k] for k in _FAILURES if c.counts[k]}
            first = next(iter(c.examples.values()), [])[:1]
            verdict.problems.append(f"{label} {name}: {bad}; e.g. {first}")


#: the run could not test what was asked (too few kills): no verdict on the engine
EXIT_INCONCLUSIVE = 3

_FAILURES = ("duplicated", "missing", "unexpected", "reordered_keys", "malformed_out")


def chaos_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    try:
        contract = load_contract(args.module, assume_deterministic=args.deterministic)
        verdict = run_chaos(
            AppRun(args.module, list(args.sets), args.config),
            contract,
            kills=args.kills,
            seed=seed,
            workdir=args.workdir.resolve(),
            kills_per_round=args.kills_per_round,
            oracle=args.oracle,
            keep=args.keep,
            timeout=args.timeout,
            reference_runs=args.reference_runs,
        )
    except AiostreamError as exc:
        print(f"aiostream-ckpt chaos: error: {exc}", file=sys.stderr)
        return 2
    print(f"chaos: seed {seed}")
    for p in verdict.problems:
        print(f"chaos: problem: {p}")
    for p in verdict.inconclusive:
        print(f"chaos: inconclusive: {p}")
    print(verdict.details())
    for a in verdict.assumptions:
        print(f"chaos: assumes: {a}")
    print(verdict.line(), flush=True)
    return 1 if verdict.problems else EXIT_INCONCLUSIVE if verdict.inconclusive else 0
