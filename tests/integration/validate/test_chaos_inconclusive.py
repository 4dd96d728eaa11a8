"""A chaos run whose input is too small for its kills says INCONCLUSIVE, not FAIL.

Was ``kills=0 events=0 verdict=FAIL`` for a multi-source app: no engine had
failed, the input had only run out before the first kill, and the events of
inputs other than ``app.input`` were not counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt_dev.chaos.cli import EXIT_INCONCLUSIVE, chaos_main
from apps.fraud_rules import write_inputs

pytestmark = pytest.mark.integration


def test_too_small_an_input_is_inconclusive_and_counts_every_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    txns, rules = write_inputs(tmp_path / "in", 3, rule_versions=2)
    argv = [
        "apps.fraud_rules",
        "--kills", "4",
        "--seed", "7",
        "--reference-runs", "1",
        "--workdir", str(tmp_path / "chaos"),
        "--set", f"app.transactions={txns}",
        "--set", f"app.rules={rules}",
        "--set", f"app.output={tmp_path / 'out'}",
    ]  # fmt: skip
    assert chaos_main(argv) == EXIT_INCONCLUSIVE
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    # 3 rounds of 3 transactions + 2 rule versions: both inputs counted
    assert last == ("chaos: kills=0 faults=0 events=15 lost=0 duplicated=0 verdict=INCONCLUSIVE"), (
        out
    )
    assert "chaos: inconclusive: 3 rounds in a row ended before any kill" in out
    assert "Give a larger input" in out and "chaos: problem:" not in out
