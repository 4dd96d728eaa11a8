"""The README's testing-kit example runs as written (its two tests pass)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_example() -> dict[str, Any]:
    text = README.read_text()
    match = re.search(r"<!-- testing-kit-example[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert match, "the README lost its testing-kit example"
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(match.group(1), str(README), "exec"), namespace)
    return namespace


def test_the_late_data_example() -> None:
    readme_example()["test_late_clicks_go_to_the_side_output_and_survive_a_failure"]()


def test_the_timer_example() -> None:
    readme_example()["test_a_reminder_fires_after_30_s_idle_also_across_a_restore"]()
