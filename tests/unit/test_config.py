"""Settings: the seed's ~/.m2config, env overrides, and errors that point at the line."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from m27._exceptions import ConfigError
from m27.cli.commands import config_cmd
from m27.config import Settings, load_settings, m27_home

# The file exactly as the original design document shows it.
SEED = """\
[performance]
gpu_streams = 4              # match the number of CUDA streams
memory_overprovision = 1.2   # GPU memory over-allocation factor
io_timeout = 50ms            # storage response wait threshold

[checkpoint]
compression_level = 3        # zstd level
diff_threshold = 128KB       # chunk size for differential saves
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def write(home: Path, text: str) -> Path:
    path = home / ".m2config"
    path.write_text(text)
    return path


def test_m27_home_defaults_to_dot_m27_and_follows_the_variable(tmp_path: Path) -> None:
    assert m27_home({"HOME": str(tmp_path)}) == tmp_path / ".m27"
    assert m27_home({"M27_HOME": str(tmp_path / "node")}) == tmp_path / "node"


def test_defaults_without_a_file(home: Path) -> None:
    settings = load_settings({"HOME": str(home)})
    assert settings == Settings()
    assert (settings.gpu_streams, settings.io_timeout, settings.diff_threshold) == (4, 0.05, 131072)
    assert (settings.keep_last, settings.max_in_flight) == (3, 2)
    assert settings.cpu_slots == (os.cpu_count() or 1)
    assert set(settings.sources.values()) == {"default"}


def test_seed_file_parses_with_line_sources(home: Path) -> None:
    write(home, SEED)
    settings = load_settings({"HOME": str(home)})
    assert settings.gpu_streams == 4
    assert settings.memory_overprovision == 1.2
    assert settings.io_timeout == pytest.approx(0.05)
    assert settings.compression_level == 3
    assert settings.diff_threshold == 128 * 1024
    assert settings.sources["gpu_streams"] == "~/.m2config:2"
    assert settings.sources["memory_overprovision"] == "~/.m2config:3"
    assert settings.sources["io_timeout"] == "~/.m2config:4"
    assert settings.sources["compression_level"] == "~/.m2config:7"
    assert settings.sources["diff_threshold"] == "~/.m2config:8"
    assert settings.sources["keep_last"] == "default"


def test_env_overrides_file(home: Path) -> None:
    write(home, SEED)
    settings = load_settings(
        {"HOME": str(home), "M27_IO_TIMEOUT": "10ms", "M27_KEEP_LAST": "5", "M27_CPU_SLOTS": "2"}
    )
    assert settings.io_timeout == pytest.approx(0.01)
    assert settings.sources["io_timeout"] == "env M27_IO_TIMEOUT"
    assert (settings.keep_last, settings.cpu_slots) == (5, 2)
    assert settings.sources["gpu_streams"] == "~/.m2config:2"


def test_m2_chunk_size_bare_number_is_kib(home: Path) -> None:
    write(home, SEED)
    settings = load_settings({"HOME": str(home), "M2_CHUNK_SIZE": "256"})
    assert settings.diff_threshold == 262144
    assert settings.sources["diff_threshold"] == "env M2_CHUNK_SIZE"
    assert load_settings({"HOME": str(home), "M2_CHUNK_SIZE": "1MiB"}).diff_threshold == 1 << 20


def test_m27_diff_threshold_wins_over_m2_chunk_size(home: Path) -> None:
    env = {"HOME": str(home), "M2_CHUNK_SIZE": "256", "M27_DIFF_THRESHOLD": "64KB"}
    settings = load_settings(env)
    assert settings.diff_threshold == 65536
    assert settings.sources["diff_threshold"] == "env M27_DIFF_THRESHOLD"


def test_m27_config_names_another_file(tmp_path: Path) -> None:
    other = tmp_path / "lab.ini"
    other.write_text("[checkpoint]\nkeep_last = 9\n")
    settings = load_settings({"HOME": str(tmp_path / "nohome"), "M27_CONFIG": str(other)})
    assert settings.keep_last == 9
    assert settings.sources["keep_last"] == f"{other}:2"


def test_missing_file_named_by_m27_config_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.ini"
    with pytest.raises(ConfigError, match=r"missing\.ini \(named by M27_CONFIG\) does not exist"):
        load_settings({"M27_CONFIG": str(missing)})
    missing.write_text("")  # an empty file: the defaults
    settings = load_settings({"M27_CONFIG": str(missing)})
    assert settings == Settings()
    assert set(settings.sources.values()) == {"default"}


def test_a_settings_file_that_cannot_be_read_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"M27_CONFIG": str(tmp_path)})  # a folder
    assert (
        str(caught.value) == f"cannot read the settings file {tmp_path}: it is a folder, not a file"
    )
    binary = tmp_path / "lab.ini"
    binary.write_bytes(b"[checkpoint]\nkeep_last = \xff\n")
    with pytest.raises(ConfigError, match=r"cannot read the settings file .*lab\.ini: 'utf-8'"):
        load_settings({"M27_CONFIG": str(binary)})


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "/dev/zero"])
def test_a_settings_file_that_is_not_a_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """`M27_CONFIG=<(...)` or a FIFO waited for a writer forever in every m27 command (each
    reads the settings), and `/dev/zero` never ended."""
    named = tmp_path / "lab.ini"
    if kind == "/dev/zero":
        named = Path(kind)
    else:
        fifo = tmp_path / "settings.fifo"
        os.mkfifo(fifo)
        if kind == "fifo":
            named = fifo
        else:
            named.symlink_to(fifo)
    what = "a device or a socket" if kind == "/dev/zero" else "a pipe"
    with pytest.raises(ConfigError) as caught:
        load_settings({"M27_CONFIG": str(named)})
    assert str(caught.value) == f"cannot read the settings file {named}: it is {what}, not a file"
    assert caught.value.file == str(named)


def test_a_missing_home_m2config_means_defaults(tmp_path: Path) -> None:
    settings = load_settings({"HOME": str(tmp_path / "nohome")})
    assert settings == Settings()


def test_missing_file_passed_by_code_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings({}, path=tmp_path / "missing.ini")


def test_unknown_key_names_line_and_suggests(home: Path) -> None:
    write(home, SEED.replace("io_timeout = 50ms", "io_timout = 50ms"))
    with pytest.raises(ConfigError) as info:
        load_settings({"HOME": str(home)})
    message = str(info.value)
    assert "~/.m2config:4" in message
    assert "io_timout" in message
    assert "did you mean 'io_timeout'" in message
    assert info.value.context["line"] == 4


def test_an_unknown_key_without_a_close_match_lists_its_sections_keys(home: Path) -> None:
    write(home, "[performance]\nbogus = 1\n")
    with pytest.raises(ConfigError) as info:
        load_settings({"HOME": str(home)})
    known = str(info.value).split("; known: ")[1].split(", ")
    assert known == ["cpu_slots", "gpu_cpus", "gpu_streams", "io_timeout", "memory_overprovision"]


def test_unknown_section_suggests_the_known_one(home: Path) -> None:
    write(home, "[checkpiont]\nkeep_last = 2\n")
    with pytest.raises(ConfigError, match=r":1: unknown section \[checkpiont\]; did you mean"):
        load_settings({"HOME": str(home)})


def test_key_in_the_wrong_section_says_where_it_belongs(home: Path) -> None:
    write(home, "[checkpoint]\nio_timeout = 50ms\n")
    with pytest.raises(ConfigError, match=r":2: io_timeout belongs in \[performance\]"):
        load_settings({"HOME": str(home)})


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        ("io_timeout = fast", "a duration"),
        ("io_timeout = 0ms", "a duration > 0"),
        ("gpu_streams = four", "a whole number"),
        ("memory_overprovision = -1", "a number > 0"),
    ],
)
def test_bad_value_names_file_line_key_and_accepted_form(
    home: Path, line: str, accepted: str
) -> None:
    write(home, f"[performance]\n# tuned for the V100s\n{line}   # comment\n")
    with pytest.raises(ConfigError) as info:
        load_settings({"HOME": str(home)})
    message = str(info.value)
    assert message.startswith("~/.m2config:3: ")
    assert line.split(" = ")[0] in message
    assert accepted in message
    assert info.value.context["key"] == line.split(" = ")[0]


def test_every_bad_entry_is_named_at_once_in_file_order_then_the_environment(
    home: Path,
) -> None:
    write(
        home,
        "[performance]\nio_timeout = fast\ncpu_slots = 2\nbogus = 1\n"
        "[agent]\nx = 1\n[checkpoint]\nkeep_last = 0\n",
    )
    with pytest.raises(ConfigError) as info:
        load_settings({"HOME": str(home), "M27_GPU_STREAMS": "0"})
    lines = str(info.value).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [
        "~/.m2config:2",
        "~/.m2config:4",
        "~/.m2config:5",
        "~/.m2config:8",
        "env M27_GPU_STREAMS='0'",
    ]
    assert "io_timeout" in lines[0] and "'bogus'" in lines[1] and "[agent]" in lines[2]
    assert info.value.context["problems"] == 5
    assert info.value.context["file"] == str(home / ".m2config")


def test_compression_level_range_is_checked(home: Path) -> None:
    write(home, "[checkpoint]\ncompression_level = 23\n")
    with pytest.raises(ConfigError, match=r"from 0 \(store raw\) to 22"):
        load_settings({"HOME": str(home)})


def test_compression_level_0_is_accepted_as_docs_checkpoints_md_says(home: Path) -> None:
    write(home, "[checkpoint]\ncompression_level = 0\n")
    assert load_settings({"HOME": str(home)}).compression_level == 0
    with pytest.raises(ConfigError, match="compression_level"):
        load_settings({"HOME": str(home), "M27_COMPRESSION_LEVEL": "-1"})


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        # the Checkpointer's own checks, then an OverflowError traceback in the step
        ("diff_threshold = 1B", "from 64B to 1GiB, a multiple of 16 bytes"),
        ("diff_threshold = 100", "a multiple of 16 bytes"),
        ("diff_threshold = " + "9" * 400 + "TB", "from 64B to 1GiB"),
        # a saver that hung (2**31 staging buffers), threads that could not start
        ("max_in_flight = 2147483648", "a whole number from 1 to 64"),
        ("checkpoint_threads = 99999999999999999999", "a whole number from 0 to 256"),
        ("keep_last = 10000000", "from 1 to 1000000"),
    ],
)
def test_a_checkpoint_setting_the_checkpointer_cannot_use_is_refused_here(
    home: Path, line: str, accepted: str
) -> None:
    write(home, f"[checkpoint]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_settings({"HOME": str(home)})
    assert accepted in str(info.value) and str(info.value).startswith("~/.m2config:2: ")
    assert len(str(info.value)) < 300  # a long value is quoted by its start


def test_a_chunk_size_variable_the_checkpointer_cannot_use_is_refused(home: Path) -> None:
    with pytest.raises(ConfigError, match="a multiple of 16 bytes"):
        load_settings({"HOME": str(home), "M2_CHUNK_SIZE": "1B"})
    assert load_settings({"HOME": str(home), "M2_CHUNK_SIZE": "256"}).diff_threshold == 262144


def test_bad_env_value_names_the_variable(home: Path) -> None:
    with pytest.raises(ConfigError, match=r"M27_GPU_STREAMS='0'.*whole number from 1 to 256"):
        load_settings({"HOME": str(home), "M27_GPU_STREAMS": "0"})
    with pytest.raises(ConfigError, match="M2_CHUNK_SIZE"):
        load_settings({"HOME": str(home), "M2_CHUNK_SIZE": "big"})


def test_duplicate_key_and_garbage_line_are_errors_with_lines(home: Path) -> None:
    write(home, "[checkpoint]\nkeep_last = 2\nkeep_last = 3\n")
    with pytest.raises(ConfigError, match=":3: keep_last is set twice"):
        load_settings({"HOME": str(home)})
    write(home, "keep_last = 2\n")
    with pytest.raises(ConfigError, match=r":1: a setting before any \[section\]"):
        load_settings({"HOME": str(home)})


@pytest.mark.parametrize(
    ("text", "line"),
    [("[checkpoint\nkeep_last = 2\n", 1), ("[service]\n[checkpoint  # x\nkeep_last = 2\n", 2)],
)
def test_a_section_header_without_its_bracket_is_named(home: Path, text: str, line: int) -> None:
    # It was "a setting before any [section] header" (first line) or "cannot parse this
    # line (expected key = value)" (later): neither the mistake.
    write(home, text)
    with pytest.raises(ConfigError, match=rf":{line}: '\[checkpoint.*' is not a section header"):
        load_settings({"HOME": str(home)})


def _run_config(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    config_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["config", *argv])
    return int(args.func(args))


def test_config_command_shows_values_and_sources_but_no_secrets(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(home, SEED)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("M27_CONFIG", raising=False)
    monkeypatch.setenv("M27_HOME", str(home / "node"))
    monkeypatch.setenv("M2_CHUNK_SIZE", "256")
    monkeypatch.setenv("M27_TELEGRAM_TOKEN", "123456:sekrit-token")
    monkeypatch.setenv("M27_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("M27_DATABASE_URL", "postgresql://m27:pw123@db/m27")
    monkeypatch.setenv("M27_GPUS", "sim:4")
    assert _run_config(monkeypatch) == 0
    out = capsys.readouterr().out
    assert "missing" not in out
    assert "io_timeout" in out and "50ms" in out and "~/.m2config:4" in out
    assert "262144 bytes" in out and "env M2_CHUNK_SIZE" in out
    assert "M27_GPUS" in out and "sim:4" in out
    shown = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}
    # as a person writes them (they were 1800.0, 60.0, 80.0)
    assert (shown["service_idle"], shown["checkpoint_grace"]) == ("30m00s", "1m00s")
    assert (shown["capture_poll"], shown["gpu_temperature"]) == ("1.0s", "80C")
    for secret in ("sekrit", "TELEGRAM_TOKEN", "hunter2", "M27_DB_PASSWORD", "pw123"):
        assert secret not in out

    assert _run_config(monkeypatch, "--json") == 0
    raw = capsys.readouterr().out
    data = json.loads(raw)
    assert data["settings"]["diff_threshold"] == {"value": 262144, "source": "env M2_CHUNK_SIZE"}
    assert data["environment"]["M27_DATABASE_URL"] == "postgresql://***@db/m27"
    assert "sekrit" not in raw and "hunter2" not in raw


def test_config_command_reports_bad_file_with_exit_2(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(home, "[performance]\ngpu_streems = 4\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("M27_CONFIG", raising=False)
    assert _run_config(monkeypatch) == 2
    assert "did you mean 'gpu_streams'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["800", "0", "-5", "nan", "inf"])
def test_a_gpu_temperature_no_gpu_reaches_is_refused_not_a_silent_alert(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"gpu_temperature must be degrees Celsius above 0"):
        load_settings({"HOME": "/nonexistent", "M27_GPU_TEMPERATURE": bad})


def test_the_gpu_temperature_alert_threshold_is_a_setting(home: Path) -> None:
    write(home, "[alerts]\ngpu_temperature = 75   # our GPUs run hot\n")
    settings = load_settings(env={"HOME": str(home)})
    assert settings.gpu_temperature == 75.0
    assert settings.sources["gpu_temperature"].endswith(":2")
    env = {"HOME": str(home), "M27_GPU_TEMPERATURE": "85"}
    assert load_settings(env=env).gpu_temperature == 85.0


def test_config_says_whether_checkpoint_hashing_was_compiled(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An install without a C compiler goes on silently with the slower Python hashing."""
    from m27.checkpoint import _chunks

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("M27_HOME", str(home / "node"))
    monkeypatch.setattr(_chunks, "_native", None)
    assert _run_config(monkeypatch) == 0
    assert "hashing: Python (m27 was installed without a C compiler" in capsys.readouterr().out
    assert _run_config(monkeypatch, "--json") == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_hashing"] == "python"
    monkeypatch.setattr(_chunks, "_native", object())
    assert _run_config(monkeypatch) == 0
    assert "hashing: compiled" in capsys.readouterr().out
