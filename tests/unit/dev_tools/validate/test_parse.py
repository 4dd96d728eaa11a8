"""The pure parts of the validator, no JVM (the Spark runs: tests/integration/validate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt_dev.validate import ValidationConfigError
from aiostream_ckpt_dev.validate.jars import artifact_of
from aiostream_ckpt_dev.validate.parse import count_parser, input_parser, position_parser
from aiostream_ckpt_dev.validate.readers import committed_name
from aiostream_ckpt_dev.validate.session import find_java


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"app_id": "a", "seq": 1}', ("ok", "a")),
        ('{"app_id": "a"}\r', ("ok", "a")),
        ('{"app_id": 5}', ("ok", None)),
        ('{"user_id": "u"}', ("ok", None)),
        ('{"app_id": "a"} trailing', ("bad_json", None)),  # Spark's reader would accept it
        ('{"app_id": "a", "x": NaN}', ("bad_json", None)),
        ('["a"]', ("not_object", None)),
        ("  \t", ("blank", None)),
        (None, ("blank", None)),
    ],
)
def test_input_lines_parse_like_the_job(line: str | None, expected: tuple[str, str | None]) -> None:
    assert input_parser("app_id")(line) == expected


def test_output_parsers_are_strict() -> None:
    parse = count_parser("app_id", "pv")
    assert parse('{"app_id": "a", "pv": 3}') == ("a", 3, None)
    assert parse('{"app_id": "a", "pv": 3.0}')[2] == "pv is not an integer"
    assert parse('{"app_id": "a", "pv": true}')[2] == "pv is not an integer"
    assert parse('{"app_id": 1, "pv": 3}')[2] == "app_id is not a string"
    assert parse("{")[2] == "not JSON"
    pos = position_parser("_pos")
    assert pos('{"_pos": ["/data/in/e-0.jsonl", 120]}') == ("e-0.jsonl", 120, None)
    assert pos('{"_pos": ["file:///d/e.jsonl", 0]}') == ("e.jsonl", 0, None)
    assert pos('{"_pos": ["topic-3", 7]}') == ("topic-3", 7, None)
    assert pos('{"_pos": ["e.jsonl", "7"]}')[2] == "no [source, offset] in _pos"


def test_committed_names_in_both_spellings() -> None:
    assert committed_name("part-0003-0000000012.jsonl") == (12, 3)
    assert committed_name("part-0000000012-0003.jsonl") == (12, 3)
    assert committed_name("dead-letter-0000000012-0003.jsonl") is None
    assert committed_name(".part-0003-0000000012.pending") is None
    with pytest.raises(ValidationConfigError, match="4-digit subtask"):
        committed_name("part-3-12.jsonl")


def test_jar_artifacts() -> None:
    assert artifact_of("spark-tags_2.13-4.1.1.jar") == "spark-tags_2.13"
    assert artifact_of("commons-pool2-2.12.1.jar") == "commons-pool2"
    assert artifact_of("zstd-jni-1.5.7-6.jar") == "zstd-jni"
    assert artifact_of("log4j-slf4j2-impl-2.24.3.jar") == "log4j-slf4j2-impl"


def test_find_java_names_java_home_and_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ValidationConfigError, match=r"JAVA_HOME=.* has no bin/java"):
        find_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValidationConfigError, match="no 'java' on PATH"):
        find_java()


def test_validate_help_shows_both_modes_and_app_first(capsys: pytest.CaptureFixture[str]) -> None:
    """``validate --help`` hid ``--app``: only ``validate --app X --help`` showed the proof."""
    from aiostream_ckpt_dev.validate.cli import validate_main

    assert validate_main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.index("--app MODULE") < text.index("--check {pv_count,positions}")
    assert "Prove exactly-once for any app" in text and "built-in checks" in text
