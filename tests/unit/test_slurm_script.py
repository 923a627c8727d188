"""The sbatch scripts m27 writes (golden files), the `slurm:` options, and the parsers of
what Slurm's tools print."""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

from m27._exceptions import ConfigError, SpecError
from m27.executors.slurm import scrub_env
from m27.executors.slurm._jobs import SubprocessSlurm, info_from_fields, parse_exit, parse_show
from m27.executors.slurm._resume import choose
from m27.executors.slurm._script import (
    ScriptInput,
    SlurmOptions,
    load_site_options,
    parse_options,
    render_script,
    slurm_time,
)

GOLDEN = Path(__file__).parent / "golden" / "slurm"
REGEN = "M27_REGEN_GOLDEN=1 pytest tests/unit/test_slurm_script.py"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("M27_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), str(path), "rendered"
            )
        )
        pytest.fail(f"{name}.sh differs from its golden file:\n{diff}\nRegenerate with: {REGEN}")


def script(
    options: SlurmOptions, argv: tuple[str, ...] = ("python3", "sim.py", "--steps", "10")
) -> str:
    return render_script(
        ScriptInput(
            run_id="md-20240501-1",
            step="simulate",
            attempt=1,
            argv=argv,
            job_dir=Path("/home/u/.m27/runs/md-20240501-1/simulate.slurm/attempt-1"),
            workdir=Path("/home/u/md"),
            python="/opt/m27/bin/python",
            options=options,
        )
    )


def test_minimal_cpu_step_script_matches_golden() -> None:
    check_golden("cpu_minimal", script(parse_options({}, site={})))


def test_gpu_step_with_every_option_matches_golden() -> None:
    opts = parse_options(
        {
            "partition": "gpu",
            "account": "lab42",
            "qos": "high",
            "time": "2h",
            "mem": "32G",
            "cpus": 8,
            "gpus": 2,
            "constraint": "a100",
            "nice": 10,
            "signal_before": 120,
            "max_requeues": 5,
            "setup": ["module load cuda/12.2"],
            "extra": ["--exclusive", "--mail-type=END"],
        },
        site={},
    )
    check_golden("gpu_full", script(opts, ("python3", "-c", "print('it''s quoted')")))


def test_step_without_requeue_has_no_signal_and_no_self_requeue() -> None:
    text = script(parse_options({"requeue": False, "gres": "gpu:a100:1"}, site={}))
    check_golden("no_requeue", text)
    assert "--signal" not in text and "scontrol requeue" not in text
    assert "CUDA_VISIBLE_DEVICES=''" not in text  # Slurm sets it for a gres GPU job


def test_tiers_map_to_qos_and_nice_and_step_keys_win() -> None:
    site = {
        "account": "lab42",
        "tiers": {"immediate": {"qos": "high"}, "background": {"qos": "low", "nice": 100}},
    }
    bg = parse_options({"tier": "background"}, site=site)
    assert (bg.account, bg.qos, bg.nice) == ("lab42", "low", 100)
    own = parse_options({"tier": "immediate", "qos": "debug"}, site=site)
    assert own.qos == "debug"
    check_golden("tier_background", script(bg))


def test_time_accepts_minutes_slurm_forms_and_durations() -> None:
    assert slurm_time(90) == "90"
    assert slurm_time("1:30:00") == "1:30:00"
    assert slurm_time("2-00:00:00") == "2-00:00:00"
    assert slurm_time("90m") == "90"
    assert slurm_time("61s") == "2"  # rounded up: Slurm counts whole minutes
    assert parse_options({}, site={}, timeout=3600.0).time == "60"
    assert parse_options({"time": 5}, site={}, timeout=3600.0).time == "5"


def test_mem_takes_slurms_sizes_as_written_and_m27_sizes_as_megabytes() -> None:
    mem = [parse_options({"mem": m}, site={}).mem for m in ("32G", "500m", "1GB", 0, 4000)]
    assert mem == ["32G", "500m", "1GB", "0", "4000"]
    # sbatch refuses "32GiB" and "1.5G" as written (Invalid --mem specification)
    mem = [parse_options({"mem": m}, site={}).mem for m in ("32GiB", "1.5GiB", "100MB ")]
    assert mem == ["32G", "1536M", "100MB"]


def test_a_gpu_step_gets_its_gpus_from_slurm_unless_an_option_names_gpus() -> None:
    assert parse_options({}, site={}, gpus=1).gpus == 1  # type: gpu, nothing more said
    assert parse_options({}, site={"gpus": 4}, gpus=1).gpus == 4
    assert parse_options({"gpus": 0}, site={}, gpus=1).gpus == 0  # asked for none
    gres = parse_options({"gres": "gpu:a100:2"}, site={}, gpus=1)
    assert (gres.gpus, gres.gres) == (None, "gpu:a100:2")
    assert parse_options({"extra": ["--gpus-per-node=2"]}, site={}, gpus=1).gpus is None
    assert parse_options({}, site={}, gpus=0).gpus is None  # a cpu step


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partiton": "gpu"}, "unknown key 'partiton'"),
        ({"mem": "lots"}, "slurm.mem: not a memory size: 'lots'"),
        ({"mem": "-1G"}, "slurm.mem"),
        ({"gpus": 1, "gres": "gpu:1"}, "gpus or gres, not both"),
        ({"cpus": 0}, "slurm.cpus must be a whole number >= 1"),
        ({"extra": ["exclusive"]}, "sbatch options"),
        ({"time": "soon"}, "slurm.time: not a time limit: 'soon'"),
        ({"tier": "urgent"}, "'urgent' is not in slurm.tiers"),
        ({"tiers": {"x": {"tier": "y"}}}, "unknown key 'tier' in slurm.tiers.x"),
        ({"requeue": "yes"}, "true or false"),
        ({"poll": "0s"}, "positive"),
        # a line break would end the #SBATCH line and make the rest a command of the job
        ({"partition": "debug\necho injected"}, r"slurm.partition 'debug\\necho injected' holds"),
        ({"account": "lab one"}, "slurm.account 'lab one' holds a blank or control character"),
        ({"constraint": "a\tb"}, "slurm.constraint"),
        ({"qos": "x\x00"}, "slurm.qos"),
        ({"extra": ["--comment=a\rb"]}, "sbatch options"),
        ({"setup": ["module load x\x00"]}, "NUL"),
    ],
)
def test_bad_options_fail_with_the_key_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_options(options, site={}, step="sim")


def test_a_site_file_m27_slurm_config_names_must_exist(
    tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a typo there ran every Slurm step without the site's account, partition and tiers
    monkeypatch.setenv("M27_SLURM_CONFIG", str(tmp_path / "slurm-typo.yaml"))
    with pytest.raises(ConfigError, match=r"^M27_SLURM_CONFIG=.*slurm-typo.yaml: no such file$"):
        load_site_options()
    monkeypatch.delenv("M27_SLURM_CONFIG")
    assert load_site_options() == {}  # $M27_HOME/slurm.yaml is optional


def test_site_file_is_optional_and_must_be_a_mapping(tmp_path: Path) -> None:
    assert load_site_options(tmp_path / "missing.yaml") == {}
    good = tmp_path / "slurm.yaml"
    good.write_text("partition: gpu\ntiers:\n  background: {nice: 50}\n")
    assert load_site_options(good)["partition"] == "gpu"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_site_options(bad)


def test_a_site_file_whose_aliases_explode_is_refused_before_it_is_loaded(tmp_path: Path) -> None:
    """`<<:` merges of merges of a 9-key mapping: safe_load would copy 9^8 keys."""
    rows = ["a: &a {k1: v, k2: v, k3: v, k4: v, k5: v, k6: v, k7: v, k8: v, k9: v}"]
    for n, prev in zip("bcdefg", "abcdef", strict=True):
        rows.append(f"{n}: &{n} {{<<: [{', '.join(['*' + prev] * 9)}]}}")
    bomb = tmp_path / "slurm.yaml"
    bomb.write_text("\n".join(rows) + "\n")
    with pytest.raises(
        ConfigError, match=r"slurm.yaml:6:12: aliases expand this to 1,144,072 values"
    ):
        load_site_options(bomb)


def test_wants_gpus_sees_gpus_gres_and_extra_args() -> None:
    assert parse_options({"gpus": 1}, site={}).wants_gpus
    assert parse_options({"gres": "gpu:a100:2"}, site={}).wants_gpus
    assert parse_options({"extra": ["--gpus-per-node=4"]}, site={}).wants_gpus
    assert not parse_options({"gres": "nvme:1"}, site={}).wants_gpus
    assert not parse_options({}, site={}).wants_gpus


def test_exported_env_drops_enclosing_job_vars_and_lets_slurm_set_gpus() -> None:
    env = {
        "SLURM_JOB_ID": "9",
        "SBATCH_TIMELIMIT": "5",
        "SLURM_CONF": "/e/s.conf",
        "CUDA_VISIBLE_DEVICES": "",
        "M27_STEP": "s",
    }
    assert scrub_env(env, wants_gpus=True) == {"SLURM_CONF": "/e/s.conf", "M27_STEP": "s"}
    assert scrub_env(env, wants_gpus=False)["CUDA_VISIBLE_DEVICES"] == ""


def test_scontrol_line_with_spaces_in_values_parses() -> None:
    line = (
        "JobId=12 JobName=m27.r.s JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
        "Requeue=1 Restarts=2 ExitCode=0:15 BatchHost=node 7 WorkDir=/home/my data "
        "Command=/x/job.sh StdOut=/x/stdout"
    )
    f = parse_show(line)
    assert f["WorkDir"] == "/home/my data" and f["BatchHost"] == "node 7"
    info = info_from_fields("12", f)
    assert (info.state, info.reason, info.restarts) == ("TIMEOUT", "TimeLimit", 2)
    assert (info.exit_code, info.signal, info.terminal) == (None, 15, True)


def test_exit_codes_parse_as_code_or_signal() -> None:
    assert parse_exit("3:0") == (3, None)
    assert parse_exit("0:9") == (None, 9)
    assert parse_exit("") == (None, None)


def test_forgotten_job_is_read_from_the_jobcomp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    comp = tmp_path / "jobcomp.txt"
    comp.write_text(
        "JobId=7 Name=x JobState=PENDING NodeList=n1 ExitCode=0:0\n"
        "JobId=7 Name=x JobState=OUT_OF_MEMORY NodeList=n1 ExitCode=0:9\n"
    )
    answers = {
        "scontrol show job": (1, "", "slurm_load_jobs error: Invalid job id specified"),
        "sacct": (1, "", "Slurm accounting storage is disabled"),
        "scontrol show config": (
            0,
            f"JobCompLoc              = {comp}\nJobCompType             = jobcomp/filetxt\n",
            "",
        ),
    }

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        key = next(k for k in answers if " ".join(argv).startswith(k))
        rc, out, err = answers[key]
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(subprocess, "run", fake_run)
    info = SubprocessSlurm().show("7")
    assert info is not None
    assert (info.state, info.signal, info.node) == ("OUT_OF_MEMORY", 9, "n1")


def test_resume_helper_prefers_the_steps_own_checkpoint_then_the_fallback(tmp_path: Path) -> None:
    assert choose(str(tmp_path / "none"), "/old/ck.json") == "/old/ck.json"
    assert choose("", "") == ""


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.sh")), ids=lambda p: p.name)
def test_golden_scripts_are_valid_bash(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
