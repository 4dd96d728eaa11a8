"""Check results and the report: a short text on stdout, all of it as JSON.

The last stdout line is ``validation: PASS <summary>`` or ``validation: FAIL
<summary>`` so scripts and CI can grep one line without parsing JSON.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

#: Examples shown per category on stdout; the JSON keeps all collected ones.
SHOWN_EXAMPLES = 5


@dataclass
class CheckResult:
    """One check's verdict: counts by category and up to N example records per failure."""

    check: str
    passed: bool
    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return f"{self.check} " + " ".join(f"{k}={v}" for k, v in self.counts.items())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()


@dataclass
class ValidationReport:
    """All checks of one validation run; passes only if every check passed."""

    results: list[CheckResult]
    seconds: float = 0.0
    spark_startup_seconds: float = 0.0
    #: what the verdict rests on (the reference-run proof's premises), printed before it
    assumptions: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def summary(self) -> str:
        return "; ".join(r.summary() for r in self.results)

    def verdict_line(self) -> str:
        return f"validation: {'PASS' if self.passed else 'FAIL'} {self.summary()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "spark_startup_seconds": round(self.spark_startup_seconds, 3),
            "assumptions": self.assumptions,
            "results": [r.to_dict() for r in self.results],
        }

    def to_json(self) -> str:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()


def print_report(
    report: ValidationReport, json_path: str | Path | None = None, out: TextIO | None = None
) -> None:
    """Print the short human report, write the JSON, and end with the verdict line."""
    out = out if out is not None else sys.stdout
    if json_path is not None:
        Path(json_path).write_text(report.to_json() + "\n")
    for r in report.results:
        print(f"[{'PASS' if r.passed else 'FAIL'}] {r.check} ({r.seconds:.1f}s)", file=out)
        for k, v in r.counts.items():
            print(f"  {k:>14}: {v}", file=out)
        for note in r.notes:
            print(f"  note: {note}", file=out)
        for kind, examples in r.examples.items():
            print(f"  {kind} (first {min(len(examples), SHOWN_EXAMPLES)}):", file=out)
            for ex in examples[:SHOWN_EXAMPLES]:
                print("    " + " ".join(f"{k}={v}" for k, v in ex.items()), file=out)
    for a in report.assumptions:
        print(f"assumes: {a}", file=out)
    if json_path is not None:
        print(f"report: {json_path}", file=out)
    print(report.verdict_line(), file=out)
    out.flush()
