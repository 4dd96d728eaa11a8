"""``chaos --oracle``: when the app's recount can check a run, and a loud FAIL when it cannot.

Before, the oracle was skipped without a word whenever the input was Kafka
(and for an app without one), and the verdict said PASS as if it had run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt_dev.chaos.cli import chaos_main, oracle_refusal, run_chaos
from aiostream_ckpt_dev.validate.proof import AppRun, load_contract

PV = load_contract("apps.pv_count")


def test_oracle_runs_on_files_and_on_kafka_input_when_the_proof_says_where() -> None:
    assert oracle_refusal(PV, None) is None
    assert oracle_refusal(PV, "127.0.0.1:9092") is None  # pv_count: kafka_oracle_input="input"


def test_oracle_refusals_name_the_reason() -> None:
    assert oracle_refusal(ProofContract(), None) == "the app's PROOF declares no oracle"
    no_input = replace(PV, kafka_oracle_input=None)
    assert oracle_refusal(no_input, None) is None  # files: the oracle reads them itself
    assert "names no kafka_oracle_input" in (oracle_refusal(no_input, "k:9092") or "")
    assert "names no kafka_inputs" in (oracle_refusal(replace(PV, kafka_inputs=()), "k:9092") or "")


def test_asked_for_oracle_that_cannot_run_fails_before_any_run(tmp_path: Path) -> None:
    # Kafka mode (nothing listens there: the verdict comes before any connection)
    run = AppRun(
        "apps.pv_count",
        [
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "app.kafka_bootstrap=127.0.0.1:1",
            "app.input_topic=in",
            "app.output_topic=out",
        ],
    )
    contract = replace(PV, kafka_oracle_input=None)
    verdict = run_chaos(run, contract, kills=1, seed=1, workdir=tmp_path / "w", oracle=True)
    assert not verdict.passed
    assert verdict.problems == [
        "oracle: not run — Kafka mode, and the app's PROOF names no kafka_oracle_input "
        "(the param its oracle reads input files from)"
    ]
    assert verdict.rounds == 0 and not (tmp_path / "w" / "reference").exists()
    assert verdict.line().endswith("verdict=FAIL")


def test_chaos_cli_reports_the_oracle_not_run_and_exits_1(tmp_path: Path, capsys) -> None:
    app = tmp_path / "no_oracle_app.py"
    app.write_text(
        "from aiostream_ckpt.api.contract import ProofContract\n"
        "PROOF = ProofContract(outputs=('output',))\n"
        "def build(env):\n    raise AssertionError('not run')\n"
    )
    args = [str(app), "--oracle", "--workdir", str(tmp_path / "w"), "--set", "app.output=out"]
    assert chaos_main(args) == 1
    out = capsys.readouterr().out
    assert "chaos: problem: oracle: not run — the app's PROOF declares no oracle" in out
    assert out.strip().endswith("verdict=FAIL")
