"""One tiny pass of the Delta-vs-files bench: both sinks run, are exact, and Spark reads both."""

from pathlib import Path

import pytest

from bench import delta_sink


@pytest.mark.integration
@pytest.mark.spark
def test_tiny_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code = delta_sink.main(
        ["--events", "20000", "--keys", "50", "--pairs", "1", "--interval", "200ms",
         "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    import json

    result = json.loads(out.read_text())
    assert result["exactly_once"] == {"files": True, "delta": True}
    assert result["spark"]["rows"] == {"files": 20000, "delta": 20000}
    assert len(result["wall_ratio_delta_over_files"]) == 1
