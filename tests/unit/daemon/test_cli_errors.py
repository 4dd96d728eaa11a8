"""Bad apps and bad config: one line naming the cause, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import cli


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


def test_missing_module() -> None:
    r = cli("run", "apps.does_not_exist")
    assert r.returncode == 2
    assert "cannot import app module 'apps.does_not_exist'" in r.stderr


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
