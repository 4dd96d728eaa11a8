"""Bad apps and bad config: one line naming the cause, exit code 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, cli


def test_app_module_that_does_not_import(tmp_path: Path) -> None:
    """The app's own frames above the one-line cause; none of the engine's or importlib's."""
    (tmp_path / "helper_mod.py").write_text(
        "X = 1\n\n\ndef load():\n    import no_such_module_xyz\n"
    )
    app = tmp_path / "broken_app.py"
    app.write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport helper_mod\nhelper_mod.load()\n"
    )
    r = cli("run", str(app), "--set", f"checkpoint.dir={tmp_path / 'c'}")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip(" ~^")]
    assert "cannot import app module" in lines[-1]
    assert "No module named 'no_such_module_xyz'" in lines[-1]
    assert lines[:5] == [
        "Traceback (the app's frames, most recent call last):",
        f'  File "{app}", line 4, in <module>',
        "    helper_mod.load()",
        f'  File "{tmp_path / "helper_mod.py"}", line 5, in load',
        "    import no_such_module_xyz",
    ], r.stderr
    assert len(lines) == 6, r.stderr
    assert not (tmp_path / "c").exists()


def _on_path(tmp_path: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    }


def test_app_module_by_name_shows_no_import_machinery(tmp_path: Path) -> None:
    """By name, ``importlib.import_module``'s frame (a file, not frozen) showed as the app's."""
    (tmp_path / "imp_app.py").write_text("import no_such_module_xyz\n")
    r = cli("run", "imp_app", "--set", f"checkpoint.dir={tmp_path / 'c'}", env=_on_path(tmp_path))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip(" ~^")]
    assert lines == [
        "Traceback (the app's frames, most recent call last):",
        f'  File "{tmp_path / "imp_app.py"}", line 1, in <module>',
        "    import no_such_module_xyz",
        "aiostream-ckpt: error: cannot import app module 'imp_app': "
        "ModuleNotFoundError: No module named 'no_such_module_xyz' (the app imports it; it is "
        f"not installed in the Python running the daemon, {sys.executable})",
    ], r.stderr


def test_app_with_a_syntax_error_shows_the_line(tmp_path: Path) -> None:
    (tmp_path / "syn_app.py").write_text("X = 1\ndef build(env)\n    pass\n")
    r = cli("run", "syn_app", "--set", f"checkpoint.dir={tmp_path / 'c'}", env=_on_path(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[:3] == [
        "Traceback (the app's frames, most recent call last):",
        f'  File "{tmp_path / "syn_app.py"}", line 2',
        "    def build(env)",
    ], r.stderr
    assert lines[-1] == (
        "aiostream-ckpt: error: cannot import app module 'syn_app': "
        "SyntaxError: expected ':' (syn_app.py, line 2)"
    ), r.stderr
    assert len(lines) == 5, r.stderr  # and the caret under the place
    assert not (tmp_path / "c").exists()


def test_build_that_fails_shows_the_apps_line(tmp_path: Path) -> None:
    app = tmp_path / "bad_build.py"
    app.write_text("def build(env):\n    params = {}\n    return params['input']\n")
    r = cli("run", str(app), "--set", f"checkpoint.dir={tmp_path / 'c'}")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip(" ~^")]  # not 3.11's carets
    assert lines == [
        "Traceback (the app's frames, most recent call last):",
        f'  File "{app}", line 3, in build',
        "    return params['input']",
        f"aiostream-ckpt: error: app module '{app}': build(env) failed: KeyError: 'input'",
    ], r.stderr


def test_missing_module_in_a_package_names_the_package_and_what_it_has() -> None:
    r = cli("run", "apps.does_not_exist")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "aiostream-ckpt: error: cannot import app module 'apps.does_not_exist': package "
        f"'apps' ({REPO / 'apps'}) has no module 'does_not_exist'; it has: "
        + ", ".join(sorted(p.stem for p in (REPO / "apps").glob("*.py") if p.stem != "__init__"))
    ), r.stderr


def test_missing_package_says_where_apps_are_looked_for(tmp_path: Path) -> None:
    """Run elsewhere than the checkout: 'No module named apps' said nothing of the directory."""
    r = subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    assert r.returncode == 2
    assert (
        f"no module 'apps' in the current directory ({tmp_path}) or on the Python path" in r.stderr
    ), r.stderr
    assert "give the app's file path (e.g. apps/pv_count.py)" in r.stderr


def test_bad_config_value_types_name_key_and_kind(tmp_path: Path) -> None:
    r = cli(
        "run",
        "apps.pv_count",
        "--set",
        "job.parallelism=two",
        "--set",
        f"checkpoint.dir={tmp_path}",
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "aiostream-ckpt: error: invalid config job.parallelism='two' (from --set): "
        "must be an integer"
    ]


def test_bad_config_value(tmp_path: Path) -> None:
    r = cli(
        "run",
        "apps.pv_count",
        "--set",
        "checkpoint.interval=fast",
        "--set",
        f"checkpoint.dir={tmp_path}",
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "aiostream-ckpt: error: invalid config checkpoint.interval='fast' (from --set): "
        "must be a duration like 500ms, 1s, 2m or a number of seconds"
    ]


def test_app_param_missing(tmp_path: Path) -> None:
    r = cli("run", "apps.pv_count", "--set", f"checkpoint.dir={tmp_path}")
    assert r.returncode == 2
    assert "set app.output" in r.stderr


def test_checkpoint_dir_required(tmp_path: Path) -> None:
    r = cli("run", "apps.pv_count", "--set", "app.output=/tmp/x", "--set", "app.generate=10")
    assert r.returncode == 2
    assert "checkpoint.dir is not set" in r.stderr


def test_an_empty_input_finishes_with_a_warning_that_names_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = (
        "run", "apps.pv_count",
        "--set", f"app.input={empty}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"checkpoint.dir={tmp_path / 'c'}",
        "--set", "rest.enabled=false",
    )  # fmt: skip
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "job 'pv_count' finished without reading a single record: its sources were empty" in (
        r.stderr
    ), r.stderr
    again = cli(*args)  # the same directory: resumed at the end of its input
    assert again.returncode == 0, again.stderr
    assert "it resumed from checkpoint 1, whose source positions were already at the end" in (
        again.stderr
    ), again.stderr


def test_a_job_that_read_records_does_not_warn(tmp_path: Path) -> None:
    events = tmp_path / "in.jsonl"
    events.write_text('{"app_id": "a", "user_id": "u", "ts": 1}\n')
    r = cli(
        "run", "apps.pv_count",
        "--set", f"app.input={events}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"checkpoint.dir={tmp_path / 'c'}",
        "--set", "rest.enabled=false",
    )  # fmt: skip
    assert r.returncode == 0 and "without reading" not in r.stderr, r.stderr
