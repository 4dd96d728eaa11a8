"""Run the bench CLI in a test and read back its runs."""

import json
from pathlib import Path
from typing import Any

from bench.cli import main


def run_bench(tmp_path: Path, args: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """``python -m bench ARGS`` on scratch dirs, no plots; its runs by (system, path)."""
    out = tmp_path / "results.json"
    code = main([*args, "--no-plots", "--work", str(tmp_path / "work"), "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    return {(r["system"], r["path"]): r for r in doc["runs"]}
