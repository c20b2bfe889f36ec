"""Bad input to the scripts in scripts/: one line `<script>: ...` naming the fix and exit 2, never a traceback,
and never a server boot first (a typo found after a 15-minute boot of the reference is a wasted boot)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import decode_window_gaps  # noqa: E402
import gates_summary  # noqa: E402
import host_spells  # noqa: E402
import measure_level2_tolerances  # noqa: E402
import plugin_e2e  # noqa: E402
import record_kernels  # noqa: E402
import routing_spread  # noqa: E402
import stream_logprobs_cost  # noqa: E402

from harness.session.suite import Suite  # noqa: E402


@pytest.fixture(autouse=True)
def no_boot(monkeypatch):
    """A script that gets as far as a boot fails the test instead of booting (unit tests run beside real servers)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the script booted a server before refusing its input")

    monkeypatch.setattr(Suite, "boot", refuse)


@pytest.fixture(autouse=True)
def verified_dir_restored():
    """record_kernels.main sets SUITE_VERIFIED_DIR for its own process (from --verified-dir). Called in-process here,
    the setting outlived the test, and a later test of the same xdist worker read the catalog from a temporary folder
    (the listing snapshot then showed every CPU entry unverified)."""
    before = os.environ.get("SUITE_VERIFIED_DIR")
    yield
    if before is None:
        os.environ.pop("SUITE_VERIFIED_DIR", None)
    else:
        os.environ["SUITE_VERIFIED_DIR"] = before


def refusal(capsys, main: Callable[[list[str]], int], argv: list[str], script: str) -> str:
    """Run a script's entry on bad input: exit 2, one non-empty line `<script>: ...` and nothing else; that line.
    plugin_e2e says its refusals on stdout, as it always has (test_plugin_e2e_resume reads them there); the others on
    stderr."""
    rc = main(argv)
    out, err = capsys.readouterr()
    said, other = (out, err) if script == "plugin_e2e" else (err, out)
    lines = [ln for ln in said.splitlines() if ln.strip()]
    assert rc == 2, (rc, out, err)
    assert len(lines) == 1 and lines[0].startswith(f"{script}: ") and not other.strip(), (out, err)
    assert "Traceback" not in out + err
    return lines[0]


@pytest.mark.parametrize("value", ["0.9", "=0.9", "gemv-bf16=", "gemv-bf16=lots", "gemv-bf16=1.5"])
def test_plugin_e2e_memory_override_without_its_config_says_the_form(capsys, tmp_path, value):
    line = refusal(capsys, plugin_e2e.main, ["--configs", "cpu-bf16", "--gpu-memory-utilization", value,
                                            "--out", str(tmp_path / "out")], "plugin_e2e")
    assert "--gpu-memory-utilization CONFIG=FRACTION" in line and repr(value) in line, line


@pytest.mark.parametrize("text", ["{not json", "{}", "[]", '{"results": ["tg32"]}'])
def test_plugin_e2e_resuming_an_out_whose_results_are_not_its_own_names_the_file_and_the_fix(capsys, tmp_path, text):
    res_file = tmp_path / "e2e.json"
    res_file.write_text(text)
    line = refusal(capsys, plugin_e2e.main, ["--configs", "cpu-bf16", "--out", str(tmp_path)], "plugin_e2e")
    assert str(res_file) in line and "delete it" in line and "another --out" in line, line


def test_plugin_e2e_out_that_cannot_be_created_is_one_line(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"  # its parent is a file
    line = refusal(capsys, plugin_e2e.main, ["--configs", "cpu-bf16", "--out", str(out)], "plugin_e2e")
    assert f"--out {out}" in line and "writable directory" in line, line


@pytest.mark.parametrize("configs", ["cpu-bf16,nonexistent", "nonexistent+SUITE_KERNELS_ROUTE=fused"])
def test_plugin_e2e_unknown_config_names_its_option_configs(capsys, tmp_path, configs):
    line = refusal(capsys, plugin_e2e.main, ["--configs", configs, "--out", str(tmp_path)], "plugin_e2e")
    assert line.startswith("plugin_e2e: --configs: unknown config 'nonexistent'; valid configs: "), line


@pytest.mark.parametrize("configs", [",", " , ,"])
def test_plugin_e2e_configs_that_name_no_config_are_refused_not_an_empty_pass(capsys, tmp_path, configs):
    """`--configs=,` measured nothing and exited 0."""
    line = refusal(capsys, plugin_e2e.main, [f"--configs={configs}", "--out", str(tmp_path)], "plugin_e2e")
    assert line.startswith(f"plugin_e2e: --configs {configs!r} names no config: pass a comma-separated list"), line


@pytest.mark.parametrize("text", [None, "{not json", '{"vllm": "0.1"}', '{"summary": {"kernels": []}, "vllm": "0.1"}'])
def test_record_kernels_unreadable_summaries_name_the_file(capsys, tmp_path, text):
    saved = tmp_path / "recording"  # None: no such directory
    if text is not None:
        saved.mkdir()
        (saved / "cpu-bf16.json").write_text(text)
    line = refusal(capsys, record_kernels.main, ["--config", "cpu-bf16", "--from-summaries", str(saved),
                                                "--run-dir", str(tmp_path / "run")], "record_kernels")
    assert line.startswith("record_kernels: --from-summaries: ") and str(saved / "cpu-bf16.json") in line, line


def test_record_kernels_unknown_sibling_names_sibling(capsys, tmp_path):
    line = refusal(capsys, record_kernels.main, ["--config", "cpu-bf16", "--sibling", "nonexistent",
                                                "--run-dir", str(tmp_path / "run")], "record_kernels")
    assert line.startswith("record_kernels: --sibling: unknown config 'nonexistent'"), line


def test_decode_window_gaps_unknown_config_is_one_line(capsys, tmp_path):
    line = refusal(capsys, decode_window_gaps.main, ["--config", "nonexistent", "--out", str(tmp_path)],
                   "decode_window_gaps")
    assert line.startswith("decode_window_gaps: --config: unknown config 'nonexistent'"), line


@pytest.mark.parametrize("configs", ["nonexistent", "cpu-bf16,nonexistent", ","])
def test_measure_level2_tolerances_checks_every_config_before_the_reference_boots(capsys, tmp_path, configs):
    line = refusal(capsys, measure_level2_tolerances.main, ["--configs", configs, "--out", str(tmp_path)],
                   "measure_level2_tolerances")
    assert line.startswith("measure_level2_tolerances: --configs"), line
    assert ("'nonexistent'" in line) if "nonexistent" in configs else ("names no config" in line), line


def test_measure_level2_tolerances_refuses_a_config_that_cannot_run_here_before_any_boot(capsys, tmp_path, on_cpu):
    """A known config this platform cannot run (triton-bf16 on CPU; a sm_90-only backend on a GB10) was refused only
    when its turn to boot came, after the reference's and the others' boots (`no_boot` fails a boot)."""
    line = refusal(capsys, measure_level2_tolerances.main, ["--configs", "cpu-bf16,cpu-bf16,triton-bf16", "--out",
                                                            str(tmp_path)], "measure_level2_tolerances")
    assert line.startswith("measure_level2_tolerances: --configs: triton-bf16 cannot run here: "), line


@pytest.mark.parametrize("script, argv", [("decode_window_gaps", ["--config", "nonexistent"]),
                                          ("measure_level2_tolerances", ["--configs", "nonexistent"])])
def test_the_command_line_entry_prints_no_traceback(tmp_path, script, argv):
    """The same refusal through `python scripts/<script>.py`: `raise SystemExit(main())` passes exit 2 on."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / f"{script}.py"), *argv, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{script}: "), r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr


def test_a_corrupt_reference_under_resume_and_a_bad_boot_timeout_are_one_line(capsys, tmp_path, monkeypatch, on_cpu):
    """--resume read OUT/reference.json with json.loads and no guard; a zero --boot-timeout (or a bad
    SUITE_BOOT_TIMEOUT) went through to a boot that timed out at once."""
    (tmp_path / "reference.json").write_text("{cut")
    line = refusal(capsys, measure_level2_tolerances.main, ["--configs", "cpu-bf16", "--out", str(tmp_path), "--resume"],
                   "measure_level2_tolerances")
    assert "reference.json is corrupt" in line and "delete it to boot the reference again" in line, line
    with pytest.raises(SystemExit) as e:
        plugin_e2e.main(["--configs", "cpu-bf16", "--out", str(tmp_path / "e2e"), "--boot-timeout", "0"])
    assert e.value.code == 2 and "argument --boot-timeout: expected a number above 0" in capsys.readouterr().err


@pytest.mark.parametrize("platform, accept, said", [
    ("sm_90", False, "was recorded on sm_90 (NVIDIA H200); this machine is cpu: replay it on a sm_90 machine"),
    (None, True, "does not say which machine recorded it"),
])
def test_record_kernels_replay_stamps_only_the_machine_that_recorded(capsys, tmp_path, platform, accept, said):
    """A replay once stamped the replaying machine: an H200's recording accepted on a GB10 read as a GB10 verification."""
    import json

    from harness.core.platform import detect_platform

    if detect_platform().name != "cpu":
        pytest.skip("replays the CPU recording")
    fixture = json.loads((REPO / "tests" / "unit" / "fixtures" / "recorded" / "cpu" / "cpu-bf16.json").read_text())
    fixture["platform"], fixture["device"] = platform, "NVIDIA H200"
    saved = tmp_path / "recording"
    saved.mkdir()
    (saved / "cpu-bf16.json").write_text(json.dumps(fixture))
    argv = ["--config", "cpu-bf16", "--from-summaries", str(saved), "--run-dir", str(tmp_path / "run"),
            "--verified-dir", str(tmp_path / "verified")] + (["--accept"] if accept else [])
    line = refusal(capsys, record_kernels.main, argv, "record_kernels")
    assert said in line, line
    assert not (tmp_path / "verified").exists() or not any((tmp_path / "verified").iterdir())


@pytest.mark.parametrize("case", ["no-args", "missing-root", "root-a-file", "corrupt-verdicts", "verdict-without-status",
                                  "verdicts-not-a-list", "out-unwritable", "out-a-directory"])
def test_gates_summary_bad_input_is_one_line(capsys, tmp_path, case):
    """No arguments was an IndexError, a missing RUNS_ROOT a FileNotFoundError, a truncated verdicts file a
    JSONDecodeError, a verdict without `status` a KeyError, an OUT it cannot write an OSError: each a traceback."""
    root, out = tmp_path / "runs", tmp_path / "summary.md"
    (root / "aa1" / "verdicts").mkdir(parents=True)
    verdicts = root / "aa1" / "verdicts" / "v.json"
    verdicts.write_text('[{"name": "tpot", "status": "pass", "message": "ok"}]')
    argv = [str(root), str(out)]
    if case == "no-args":
        argv = []
    elif case == "missing-root":
        argv[0] = str(tmp_path / "nope")
    elif case == "root-a-file":
        argv[0] = str(verdicts)
    elif case == "corrupt-verdicts":
        verdicts.write_text('[{"name": "tpot", "sta')
    elif case == "verdict-without-status":
        verdicts.write_text('[{"name": "tpot", "message": "ok"}]')
    elif case == "verdicts-not-a-list":
        verdicts.write_text('{"name": "tpot", "status": "pass"}')
    elif case == "out-unwritable":
        argv[1] = "/proc/nope/summary.md"
    elif case == "out-a-directory":
        argv[1] = str(tmp_path)
    line = refusal(capsys, gates_summary.cli, argv, "gates_summary")
    if "verdict" in case:
        assert str(verdicts) in line, line


@pytest.mark.parametrize("script, said", [("routing_spread", "routing_spread: --out /proc/nope"),
                                          ("crosscheck_llama_benchy", "crosscheck: --out /proc/nope"),
                                          ("host_spells", "host_spells: --out /proc/nope"),
                                          ("stream_logprobs_cost", "stream_logprobs_cost: --out /proc/nope")])
def test_an_out_that_cannot_be_written_is_one_line_before_anything_runs(script, said):
    """routing_spread and crosscheck made --out with mkdir before their try: a folder they cannot write was a
    traceback. host_spells and stream_logprobs_cost handed --out to Suite.create as the run directory, whose line
    blamed --run-dir, an option they do not have."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / f"{script}.py"), "--out", "/proc/nope"],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("script, argv, said", [
    ("stream_logprobs_cost", ["--rounds", "0"], "argument --rounds: expected a whole number above 0, got '0'"),
    ("stream_logprobs_cost", ["--rounds", "-2"], "argument --rounds: expected a whole number above 0, got '-2'"),
    ("routing_spread", ["--boot-timeout", "0"], "argument --boot-timeout: expected a number above 0, got '0'"),
    ("routing_spread", ["--boot-timeout", "-5"], "argument --boot-timeout: expected a number above 0, got '-5'"),
    ("routing_spread", ["--tokens", "0"], "argument --tokens: expected a whole number above 0, got '0'"),
    ("routing_spread", ["--concurrency", "-1"], "argument --concurrency: expected a whole number above 0, got '-1'"),
    ("routing_spread", ["--gpu-memory-utilization", "1.5"],
     "argument --gpu-memory-utilization: expected a number above 0 and at most 1, got '1.5'"),
    ("crosscheck_llama_benchy", ["--boot-timeout", "0"], "argument --boot-timeout: expected a number above 0, got '0'"),
    ("crosscheck_llama_benchy", ["--boot-timeout", "-1"], "argument --boot-timeout: expected a number above 0, got '-1'"),
    ("crosscheck_llama_benchy", ["--pp", "0"], "argument --pp: expected a whole number above 0, got '0'"),
    ("crosscheck_llama_benchy", ["--tg", "-32"], "argument --tg: expected a whole number above 0, got '-32'"),
    ("crosscheck_llama_benchy", ["--runs", "0"], "argument --runs: expected a whole number above 0, got '0'"),
    ("decode_window_gaps", ["--tokens", "0"], "argument --tokens: expected a whole number above 0, got '0'"),
    ("lm_head_host_cost", ["--calls", "0"], "argument --calls: expected a whole number above 0, got '0'"),
])
def test_a_count_or_timeout_that_is_not_above_zero_is_argparses_one_line(capsys, monkeypatch, tmp_path, script, argv,
                                                                        said):
    """Zero rounds ended in statistics.median's traceback after the boot, a zero or negative --boot-timeout timed the
    boot out at once, zero tokens or calls measured nothing: each is argparse's usage error now, exit 2, before any
    boot (`no_boot`)."""
    import importlib

    monkeypatch.setattr(sys, "path", [*sys.path])  # lm_head_host_cost puts plugins/site on it for its own process
    main = importlib.import_module(script).main
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err


@pytest.mark.parametrize("where", ["/proc/nope", "a-file"])
def test_record_kernels_verified_dir_it_cannot_write_is_one_line_before_any_boot(capsys, tmp_path, where):
    """--accept wrote there only after the recording's boots: a file or a read-only place was a traceback at the end."""
    if where == "a-file":
        where = str(tmp_path / "a-file")
        Path(where).write_text("")
    line = refusal(capsys, record_kernels.main, ["--config", "cpu-bf16", "--accept", "--verified-dir", where,
                                                "--run-dir", str(tmp_path / "run")], "record_kernels")
    assert line.startswith(f"record_kernels: --verified-dir {where}: cannot write there"), line


@pytest.mark.parametrize("module, argv, said", [
    ("kernels.tools.build", ["--src", "/nonexistent.cu"], "argument --src: /nonexistent.cu: no such file"),
    ("kernels.tools.build", ["--arch", "abc"], "argument --arch: arch 'abc' is not like 90, 90a or 121a"),
    ("kernels.tools.sass_count", ["--cuda", "--arch", "abc"], "argument --arch: arch 'abc' is not like 90"),
])
def test_kernel_tools_refuse_a_bad_arch_or_source_in_argparse(capsys, module, argv, said):
    """A bad --arch was a ValueError traceback from gencode, a missing --src nvcc's error after the toolchain
    lookup; both are argparse's error line now, exit 2, before any toolchain is looked for."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err


@pytest.mark.parametrize("script", sorted(p.stem for p in (REPO / "scripts").glob("*.py")))
def test_every_script_answers_help_and_refuses_an_unknown_option_without_running(script):
    """`--help` describes a script and a mistyped option is argparse's exit 2, before any boot or model load: a script
    without a parser (dense_quant_ppl had none) ran its minutes of work on `--help`."""
    path = str(REPO / "scripts" / f"{script}.py")
    helped = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stdout[-1000:] + helped.stderr[-2000:]
    # the required arguments' line, or the unknown option's: either way argparse's usage and exit 2, nothing ran
    refused = subprocess.run([sys.executable, path, "--no-such-option"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "usage: " in refused.stderr, refused.stdout[-1000:] + refused.stderr[-2000:]
    assert "Traceback" not in helped.stderr + refused.stderr


@pytest.mark.parametrize("script, module, out", [
    ("plugin_e2e", plugin_e2e, True), ("routing_spread", routing_spread, True), ("host_spells", host_spells, True),
    ("stream_logprobs_cost", stream_logprobs_cost, True), ("decode_window_gaps", decode_window_gaps, True),
    ("measure_level2_tolerances", measure_level2_tolerances, True), ("record_kernels", record_kernels, False),
])
@pytest.mark.parametrize("model", ["", " "])
def test_an_empty_model_is_refused_not_the_default_model_in_silence(capsys, tmp_path, script, module, out, model):
    """`--model "$MODEL"` with MODEL unset booted the script's default model (the CPU's tiny one, or the 120b shape) and
    reported it as the model asked for; pytest refused it, the scripts did not."""
    argv = ["--model", model, "--configs" if script == "plugin_e2e" else "--config", "cpu-bf16"]
    line = refusal(capsys, module.main, argv + (["--out", str(tmp_path / "out")] if out else []), script)
    assert line == f"{script}: --model={model!r} is empty; give it a value, or leave the option out for its default"
