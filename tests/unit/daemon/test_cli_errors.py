"""Bad apps and bad config: one line naming the cause, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import cli


def test_app_module_that_does_not_import(tmp_path: Path) -> None:
    app = tmp_path / "broken_app.py"
    app.write_text("import no_such_module_xyz\n")
    r = cli("run", str(app), "--set", f"checkpoint.dir={tmp_path / 'c'}")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "cannot import app module" in lines[0]
    assert "No module named 'no_such_module_xyz'" in lines[0]
    assert not (tmp_path / "c").exists()


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
