"""The import-contract check: what it refuses, on a small package laid out for it."""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt_dev.import_contracts import check


def _package(root: Path, files: dict[str, str]) -> Path:
    """Lay out ``aiostream_ckpt`` under ``root`` with every layer present and empty."""
    pkg = root / "aiostream_ckpt"
    for name in ("api", "runtime", "time", "jobspec", "state", "connectors", "daemon", "testing"):
        (pkg / name).mkdir(parents=True, exist_ok=True)
        (pkg / name / "__init__.py").write_text("")
    for name in ("errors", "clock"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for path, text in files.items():
        (pkg / path).write_text(text)
    return pkg


def _debts_free(problems: list[str]) -> list[str]:
    """Drop the complaints about DEBTS edges this small package has no import for."""
    return [p for p in problems if not p.startswith("DEBTS lists")]


def test_downward_imports_pass(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "api/stream.py": "from aiostream_ckpt.runtime.job import run\n",
            "runtime/job.py": "from aiostream_ckpt.jobspec.graph import Spec\n",
            "jobspec/graph.py": "from aiostream_ckpt.errors import E\n",
        },
    )
    assert _debts_free(check(pkg)) == []


def test_an_upward_import_fails_even_inside_a_function_or_for_types(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "api/environment.py": "",
            "runtime/job.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from aiostream_ckpt.api.environment import Env\n"
                "def run():\n"
                "    from aiostream_ckpt.api import environment\n"
            ),
        },
    )
    problems = _debts_free(check(pkg))
    assert [p.split(": ", 1)[1] for p in problems] == [
        "runtime imports api (a higher layer): aiostream_ckpt.api.environment",
        "runtime imports api (a higher layer): aiostream_ckpt.api.environment",
    ]
    assert [p.split(": ", 1)[0].rsplit(":", 1)[1] for p in problems] == ["3", "5"]


def test_siblings_of_one_layer_do_not_import_each_other(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"state/backend.py": "from aiostream_ckpt.connectors import base\n"})
    (pkg / "connectors" / "base.py").write_text("")
    assert sum("state imports connectors (a sibling in its layer)" in p for p in check(pkg)) == 1


def test_a_function_local_import_that_closes_a_cycle_fails(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "runtime/operators.py": "from aiostream_ckpt.runtime.failures import describe\n",
            "runtime/failures.py": (
                "def describe():\n    from aiostream_ckpt.runtime.operators import Operator\n"
            ),
        },
    )
    cycles = [p for p in check(pkg) if p.startswith("import cycle")]
    assert cycles == [
        "import cycle: aiostream_ckpt.runtime.failures:2 (in a function) -> "
        "aiostream_ckpt.runtime.operators:1 -> aiostream_ckpt.runtime.failures"
    ]


def test_a_cycle_closed_only_under_type_checking_passes(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "runtime/operators.py": "from aiostream_ckpt.runtime.failures import describe\n",
            "runtime/failures.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from aiostream_ckpt.runtime.operators import Operator\n"
            ),
        },
    )
    assert _debts_free(check(pkg)) == []


def test_the_else_of_type_checking_runs_and_counts(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "runtime/operators.py": "from aiostream_ckpt.runtime.failures import describe\n",
            "runtime/failures.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    pass\n"
                "else:\n"
                "    from aiostream_ckpt.runtime.operators import Operator\n"
            ),
        },
    )
    assert [p for p in check(pkg) if p.startswith("import cycle")] == [
        "import cycle: aiostream_ckpt.runtime.failures:5 -> "
        "aiostream_ckpt.runtime.operators:1 -> aiostream_ckpt.runtime.failures"
    ]


def test_a_package_in_no_layer_fails(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {})
    (pkg / "newroom").mkdir()
    (pkg / "newroom" / "__init__.py").write_text("")
    assert any("newroom: not in any layer" in p for p in check(pkg))


def _runtime(root: Path, files: dict[str, str]) -> Path:
    """Lay out the package with runtime's families present and empty, and ``files``."""
    pkg = _package(root, {})
    for family in ("windowing", "async_io", "two_input", "network", "failover", "workers"):
        (pkg / "runtime" / family).mkdir()
        (pkg / "runtime" / family / "__init__.py").write_text("")
    for path, text in files.items():
        (pkg / path).write_text(text)
    return pkg


def test_runtime_families_import_the_core_and_graph_imports_the_families(tmp_path: Path) -> None:
    pkg = _runtime(
        tmp_path,
        {
            "runtime/task.py": "from aiostream_ckpt.runtime.chain import ChainSpec\n",
            "runtime/chain.py": "",
            "runtime/windowing/window_operator.py": "from aiostream_ckpt.runtime import task\n",
            "runtime/graph.py": (
                "from aiostream_ckpt.runtime.windowing.window_operator import WindowOperator\n"
            ),
            "runtime/workers/attempt.py": "from aiostream_ckpt.runtime.graph import Chain\n",
            "runtime/job.py": "from aiostream_ckpt.runtime.workers import attempt\n",
        },
    )
    assert _debts_free(check(pkg)) == []


def test_the_runtime_core_imports_no_family(tmp_path: Path) -> None:
    pkg = _runtime(
        tmp_path,
        {
            "runtime/task.py": "from aiostream_ckpt.runtime.windowing import window_operator\n",
            "runtime/windowing/window_operator.py": "",
            "runtime/chain.py": "def f():\n    from aiostream_ckpt.runtime.graph import Chain\n",
            "runtime/graph.py": "",
        },
    )
    assert sorted(p.split(": ", 1)[1] for p in _debts_free(check(pkg))) == [
        "runtime/core imports runtime/graph (a higher layer): aiostream_ckpt.runtime.graph",
        "runtime/core imports runtime/windowing (a higher layer): "
        "aiostream_ckpt.runtime.windowing.window_operator",
    ]


def test_a_runtime_family_imports_no_family_beside_or_above_it(tmp_path: Path) -> None:
    pkg = _runtime(
        tmp_path,
        {
            "runtime/two_input/co_process.py": "from aiostream_ckpt.runtime.windowing import w\n",
            "runtime/windowing/w.py": "from aiostream_ckpt.runtime.workers import attempt\n",
            "runtime/workers/attempt.py": "",
        },
    )
    assert sorted(p.split(": ", 1)[1] for p in _debts_free(check(pkg))) == [
        "runtime/two_input imports runtime/windowing (a sibling in its layer): "
        "aiostream_ckpt.runtime.windowing.w",
        "runtime/windowing imports runtime/workers (a higher layer): "
        "aiostream_ckpt.runtime.workers.attempt",
    ]


def test_a_runtime_family_in_no_layer_fails(tmp_path: Path) -> None:
    pkg = _runtime(tmp_path, {})
    (pkg / "runtime" / "newroom").mkdir()
    (pkg / "runtime" / "newroom" / "__init__.py").write_text("")
    assert any("runtime/newroom: not in any layer of runtime" in p for p in check(pkg))


def test_the_engine_never_imports_the_dev_tooling(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path, {"daemon/cli.py": "def main():\n    import aiostream_ckpt_dev.chaos\n"}
    )
    assert [p.split(": ", 1)[1] for p in _debts_free(check(pkg))] == [
        "the engine imports aiostream_ckpt_dev.chaos"
    ]


def test_the_package_keeps_its_contracts() -> None:
    root = Path(__file__).resolve().parents[3] / "aiostream_ckpt"
    assert check(root) == []
