"""An exception in a user function names the operator, the record and the app's line.

At the default log level (issue 16, item 5): was ``job 'py' failed (...):
KeyError: 'fees'`` with the traceback only at ``log.level=DEBUG``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli

pytestmark = pytest.mark.integration

APP = """\
from aiostream_ckpt.api import KeyedProcessFunction
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource


def fee_of(event):
    return event["fees"] * 2


class SumFees(KeyedProcessFunction):
    def process_element(self, value, ctx, out):
        out.collect(fee_of(value))


def build(env):
    events = env.from_source(JsonLinesFileSource(env.params["input"]), uid="events")
    if env.params.get("where") == "map":
        events = events.map(fee_of, uid="fees-map")
    events.key_by(lambda e: str(e)).process(SumFees(), uid="fee-sum").sink_to(
        ExactlyOnceFileSink(env.params["output"]), uid="sink"
    )
"""


def run(tmp_path: Path, where: str) -> list[str]:
    app = tmp_path / "fees_app.py"
    app.write_text(APP)
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"app_id": "a", "fees": 1}\n{"app_id": "b", "fee": 2}\n')
    r = cli(
        "run", str(app),
        "--set", f"checkpoint.dir={tmp_path / 'c'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"app.where={where}",
        "--set", "restart.strategy=fixed_delay",
        "--set", "restart.attempts=1",
        "--set", "restart.delay=10ms",
        "--set", "rest.enabled=false",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    return [ln for ln in r.stderr.strip().splitlines() if ln.strip(" ~^")]


def test_process_function_error_names_operator_record_and_line(tmp_path: Path) -> None:
    lines = run(tmp_path, "process")
    app = tmp_path / "fees_app.py"
    assert lines[-1] == (
        "aiostream-ckpt: job 'fees_app' failed after 1 restart (restart.strategy=fixed_delay "
        "exhausted its restart.attempts=1): operator 'fee-sum' failed on a record "
        f"{{'app_id': 'b', 'fee': 2}} (in the batch read up to {tmp_path / 'in.jsonl'} @ 53) "
        f"at {app}:6 in fee_of: KeyError: 'fees'"
    ), lines[-1]
    assert lines[-5:-1] == [
        f'  File "{app}", line 11, in process_element',
        "    out.collect(fee_of(value))",
        f'  File "{app}", line 6, in fee_of',
        '    return event["fees"] * 2',
    ]
    # the restart was logged at the default level with the same traceback
    (restart,) = [ln for ln in lines if "restart 1 in" in ln]
    assert "operator 'fee-sum' failed on a record" in restart
    assert lines.count(f'  File "{app}", line 6, in fee_of') == 2
    assert not [ln for ln in lines if "aiostream_ckpt/" in ln], "engine frames trimmed"


def test_map_chained_to_the_source_names_the_read_position(tmp_path: Path) -> None:
    lines = run(tmp_path, "map")
    size = (tmp_path / "in.jsonl").stat().st_size
    assert (
        "operator 'fees-map' failed on a record {'app_id': 'b', 'fee': 2} "
        f"(in the batch read up to {tmp_path / 'in.jsonl'} @ {size})"
    ) in lines[-1], lines[-1]
    assert lines[-1].endswith("in fee_of: KeyError: 'fees'")
