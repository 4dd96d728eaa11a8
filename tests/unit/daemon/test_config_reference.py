"""The README's config table is generated from the schema and up to date (issue 16, item 10)."""

from __future__ import annotations

import pytest

from aiostream_ckpt.daemon import config_reference
from aiostream_ckpt.daemon.config import load_config, schema_defaults
from aiostream_ckpt.errors import ConfigError
from tests.helpers import REPO, cli


def test_every_config_key_is_documented() -> None:
    keys = {key for key, _, _ in config_reference.rows()}
    assert keys == set(schema_defaults())
    for key in ("job.name", "log.level", "state.local_dir", "errors.dead_letter_dir"):
        assert key in keys
    assert "restart.max_delay" in keys


def test_every_documented_key_is_accepted_by_the_loader() -> None:
    """The schema the table is made from is the one the loader checks against."""
    for key, value in schema_defaults().items():
        if key == "app.*" or value is None:
            continue
        raw = value.value if hasattr(value, "value") else value
        if key == "restart.max_delay":
            raw = 120
        load_config(sets=[f"{key}={raw}"])


def test_readme_table_is_up_to_date() -> None:
    readme = (REPO / "README.md").read_text()
    assert config_reference.render_into(readme) == readme, (
        "README config table is stale: run `aiostream-ckpt config-reference --write README.md`"
    )


def test_an_undocumented_key_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(config_reference.MEANINGS, "restart.max_delay")
    with pytest.raises(ConfigError, match=r"without a meaning.*restart\.max_delay"):
        config_reference.rows()


def test_cli_prints_the_table() -> None:
    r = cli("config-reference")
    assert r.returncode == 0, r.stderr
    assert r.stdout == config_reference.markdown()
    assert "| `log.level` | `INFO` |" in r.stdout


def test_log_level_and_progress_interval_are_checked() -> None:
    assert load_config(sets=["progress.interval=2s"]).progress_interval == 2.0
    with pytest.raises(ConfigError, match=r"log\.level='loud'.*DEBUG, INFO, WARNING, ERROR"):
        load_config(sets=["log.level=loud"])


def test_process_keys_point_to_the_performance_doc() -> None:
    """The process profile is documented once, in docs/performance.md (issue 17, item 4)."""
    doc = (REPO / "docs" / "performance.md").read_text()
    process_keys = [row for row in config_reference.rows() if row[0].startswith("process.")]
    assert {row[0] for row in process_keys} == {
        "process.gc_threshold",
        "process.malloc_trim_threshold",
        "process.switch_interval",
    }
    for key, _, meaning in process_keys:
        assert "docs/performance.md" in meaning, key
        assert f"`{key}`" in doc, key
