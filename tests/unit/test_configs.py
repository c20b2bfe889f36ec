"""Config loading, naming and errors (no vLLM needed)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.catalog import CONFIG_DIR, Catalog, args_to_argv
from harness.core.errors import SuiteError
from harness.engine.server import free_port
from tests.unit.loopback import loopback_server
from tests.unit.recordings import catalog_unrecorded_on

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def catalog():
    return Catalog()


def test_every_named_config_round_trips_through_its_name(catalog):
    for config in catalog.named:
        assert catalog.parse(catalog.name(config)).values == config.values


def test_names_are_built_from_the_axes(catalog):
    assert catalog.name(catalog.make({"moe": "gemm", "activation": "mxfp8"}, "t")) == "gemm-mxfp8"
    c = catalog.make({"moe": "gemm", "activation": "mxfp8", "spec": "eagle3-short", "graphs": "off"}, "t")
    assert catalog.name(c) == "gemm-mxfp8-eagle3-short-eager"


def test_unknown_config_lists_valid_choices(catalog):
    with pytest.raises(SuiteError, match="unknown config 'nope'.*valid configs: cpu-bf16"):
        catalog.parse("nope")


def test_non_canonical_name_suggests_the_canonical_one(catalog):
    with pytest.raises(SuiteError, match="did you mean 'gemm-mxfp8-tile64x128-eager'"):
        catalog.parse("gemm-mxfp8-eager-tile64x128")


@pytest.mark.parametrize("option, expect", [
    ("cpu-bf16,cpu-bf16", "--config names cpu-bf16 twice; name it once"),
    ("cpu-bf16, cpu-bf16-eager,cpu-bf16 ", "--config names cpu-bf16 twice; name it once"),
    ("all,cpu-bf16", "--config=all,cpu-bf16: all already names every config; pass --config=all alone, or only names"),
], ids=["twice", "twice-with-spaces", "all-and-a-name"])
def test_a_config_named_twice_is_one_line_not_two_servers(catalog, option, expect):
    """`--config=cpu-bf16,cpu-bf16` booted and judged the same config twice (pytest suffixed the duplicate ids)."""
    with pytest.raises(SuiteError) as e:
        catalog.select(option, "cpu")
    assert str(e.value) == expect


def test_a_config_option_of_only_commas_or_blanks_is_an_error_not_no_config(catalog):
    """No --config means the platform's default; `--config=,` once selected no config, so nothing ran, and an empty
    one (an unset shell variable) ran the default in silence."""
    assert catalog.select(None, "cpu") == [catalog.default_for("cpu")]
    for option in ("", ",", " , ", " "):
        with pytest.raises(SuiteError, match="names no config"):
            catalog.select(option, "cpu")


def test_distinct_configs_and_all_keep_their_order(catalog):
    assert [catalog.name(c) for c in catalog.select("cpu-bf16-eager, cpu-bf16", "cpu")] == ["cpu-bf16-eager", "cpu-bf16"]
    assert catalog.select(" all ", "cpu") == catalog.named


def test_unknown_axis_value_names_valid_values(catalog):
    with pytest.raises(SuiteError, match="moe='cutlass' is not one of marlin, gemm"):
        catalog.make({"moe": "cutlass", "activation": "bf16"}, "t")


def test_flavours_map_the_same_name_three_ways(catalog):
    cfg = catalog.parse("marlin-bf16")
    fork = catalog.flavours["fork"].resolve(cfg, "sm_121")
    upstream = catalog.flavours["upstream"].resolve(cfg, "sm_90")
    assert fork.env["VLLM_MXFP4_MOE_KERNEL"] == "marlin"
    assert upstream.args[upstream.args.index("--moe-backend") + 1] == "marlin"
    ok, why = catalog.flavours["cpu"].runnable(cfg, "cpu")
    assert not ok and "Marlin is a CUDA kernel" in why


def test_seed_baseline_flags_are_in_every_gpu_flavour(catalog):
    for name in ("fork", "upstream"):
        argv = catalog.flavours[name].resolve(catalog.parse("marlin-bf16"), "sm_121").args
        for flag, value in (("--max-num-seqs", "2"), ("--max-num-batched-tokens", "8192"), ("--gpu-memory-utilization", "0.7")):
            assert argv[argv.index(flag) + 1] == value
        assert "--enable-prefix-caching" in argv


def test_runnable_reports_platform_reasons(catalog):
    up = catalog.flavours["upstream"]
    ok, why = up.runnable(catalog.parse("gemm-mxfp8"), "sm_90")
    assert not ok and "sm_12x" in why
    assert up.runnable(catalog.parse("gemm-mxfp8"), "sm_121")[0]
    assert up.runnable(catalog.parse("triton-bf16"), "sm_90")[0]


@pytest.mark.parametrize("flavour, platform, ok", [("upstream", "sm_80", True), ("upstream", "sm_75", False),
                                                   ("fork", "sm_121", True), ("fork", "sm_100", True),
                                                   ("fork", "sm_90", False), ("cpu", "sm_90", False)])
def test_a_flavour_runs_only_on_the_platforms_it_names(catalog, flavour, platform, ok):
    """marlin-bf16 maps in every GPU flavour, so only the flavour's own `platforms` keeps the fork's env vars off an
    H200 (sm_90) and upstream off a pre-Ampere GPU: there they would boot and be judged by another platform's
    kernel entries. Each threshold both ways: sm_80 is >=sm_80, sm_75 is not."""
    cfg = catalog.parse("marlin-bf16" if flavour != "cpu" else "cpu-bf16")
    runs, why = catalog.flavours[flavour].runnable(cfg, platform)
    assert runs is ok, why
    assert ok or (f"flavour '{flavour}' runs on" in why and f"not {platform}" in why), why


def test_what_a_gb10_flavour_cannot_run_is_skipped_with_its_reason(catalog):
    """What the flavour files themselves say cannot run on GB10 is refused there (a skip naming why), not booted to
    fail: the fork reads no VLLM_MXFP4_ACTIVATION, so MXFP8 activations come only with its CUTLASS MoE (marlin-mxfp8
    failed level 6 by construction); vLLM 0.26's FlashInfer has no sm_12x sinks (GB10.md listed it as skipped)."""
    fork, up = catalog.flavours["fork"], catalog.flavours["upstream"]
    ok, why = fork.runnable(catalog.parse("marlin-mxfp8"), "sm_121")
    assert not ok and "CUTLASS MoE" in why and "VLLM_MXFP4_ACTIVATION is not read" in why
    assert fork.runnable(catalog.parse("gemm-mxfp8"), "sm_121")[0]
    ok, why = up.runnable(catalog.parse("marlin-bf16-attn-flashinfer"), "sm_121")
    assert not ok and "FlashInfer 0.6.16" in why
    assert fork.runnable(catalog.parse("marlin-bf16-attn-flashinfer"), "sm_121")[0]  # the users' FlashInfer has them


def test_kernel_expectations_follow_the_platform(catalog):
    spec = catalog.flavours["upstream"].resolve(catalog.parse("triton-bf16"), "sm_90")
    assert "_matmul_ogs_*mxfp4*" in spec.kernels.must and "*marlin_moe_wna16*" in spec.kernels.must_not
    assert spec.kernels.source["*marlin_moe_wna16*"] == ["moe=triton"]
    assert spec.kernels.verification["moe=triton"].startswith("verified: NVIDIA H200")
    unrecorded = catalog_unrecorded_on("sm_121")  # GB10's patterns as shipped, before any recording of the users'
    gb10 = unrecorded.flavours["upstream"].resolve(unrecorded.parse("marlin-bf16"), "sm_121").kernels
    assert gb10.must == ["*marlin_moe_wna16*", "*kernel_unified_attention*", "reshape_and_cache_kernel_flash"]
    assert set(gb10.unverified) == {"moe=marlin", "attention=auto"}


def test_args_to_argv_handles_bare_and_removed_flags():
    assert args_to_argv({"--a": 1, "--b": None, "--c": False}) == ["--a", "1", "--b"]


def _copy_configs(tmp_path: Path) -> Path:
    dst = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, dst)
    return dst


@pytest.mark.parametrize("file, old, new, expect", [
    ("configs.yaml", "defaults:            #", "defaults: [cpu-bf16]\nunused:            #",
     "configs.yaml: defaults: expected a mapping of NAME: value"),
    ("configs.yaml", "  cpu: cpu-bf16", "  cpuu: cpu-bf16", "configs.yaml: defaults: 'cpuu' is not a platform selector"),
    ("flavours/cpu.yaml", "platforms: [cpu]", "platforms: cpu",
     "cpu.yaml: platforms: expected a list of platform selectors such as [cpu] or [sm_90, sm_12x], got 'cpu'"),
    ("flavours/cpu.yaml", "args:  #", "args: [--dtype]\nunused:  #", "cpu.yaml: args: expected a mapping of NAME: value, got list"),
    ("flavours/cpu.yaml", '"off": {args: {--no-enable-chunked-prefill: null}}', '"off": {args: [--no-enable-chunked-prefill]}',
     "args: expected a mapping of NAME: value, got list"),
    ("configs.yaml", "configs:\n", "configs: 5\nconfigs_as_they_were:\n", "configs.yaml: configs: expected a list"),
    ("flavours/upstream.yaml", "combos:\n", "combos: 5\ncombos_as_they_were:\n", "upstream.yaml: combos: expected a list"),
    ("flavours/upstream.yaml", "  - when: {moe: gemm, activation: mxfp8}", "  - when: moe=gemm",
     "upstream.yaml: combos #1.when: expected a mapping of NAME: value, got str"),
    ("flavours/upstream.yaml", "  - when: {moe: gemm, activation: mxfp8}", "  - when: [moe, gemm]",
     "upstream.yaml: combos #1.when: expected a mapping of NAME: value, got list"),
    ("flavours/upstream.yaml", "  - when: {moe: gemm, activation: mxfp8}", "  - when: {moee: gemm}",
     "upstream.yaml: combos #1.when: moee=gemm is not an axis value"),
], ids=["defaults-as-a-list", "a-mistyped-default-selector", "platforms-as-a-string", "args-as-a-list",
        "a-values-args-as-a-list", "configs-a-number", "combos-a-number", "combo-when-a-string", "combo-when-a-list",
        "combo-when-an-unknown-axis"])
def test_a_config_file_of_the_wrong_shape_is_one_clear_line(tmp_path, file, old, new, expect):
    """Once INTERNALERRORs (dict() of a list) or a silent miss (a mistyped selector matches no platform, so its
    default is never used); each is now refused when the catalog loads, naming the file and the key."""
    d = _copy_configs(tmp_path)
    p = d / file
    assert old in p.read_text()
    p.write_text(p.read_text().replace(old, new, 1))
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("file, old, new, expect", [
    ("flavours/cpu.yaml", "  tile:\n    auto: {}", "  tile: [auto]", "cpu.yaml: values.tile: expected a mapping"),
    ("flavours/cpu.yaml", 'common_seen:\n  cpu: ["_C::onednn_mm", "aten::topk", "aten::copy_", "aten::empty"]',
     'common_seen: ["_C::onednn_mm"]', "cpu.yaml: common_seen: expected a mapping"),
    ("flavours/cpu.yaml", "unsupported:\n", "unsupported: [moe.marlin, moe.gemm]\nunsupported_as_it_was:\n",
     "cpu.yaml: unsupported: expected a mapping"),
    ("flavours/fork.yaml", '      rejected:\n        sm_12x: "OpenAI', '      rejected: [sm_12x]\n      why: "OpenAI',
     "fork.yaml: values.moe.triton.rejected: expected a mapping"),
    ("flavours/cpu.yaml", 'verified: no  # recorded in configs/verified/cpu.yaml\n          must: ["_C::cpu_fused_moe"]',
     'verified: 1\n          must: ["_C::cpu_fused_moe"]', "values.moe.cpu.kernels.cpu.verified: 1: a verification is recorded in configs/verified/"),
    ("flavours/cpu.yaml", 'verified: no  # recorded in configs/verified/cpu.yaml\n          must: ["_C::cpu_fused_moe"]',
     'verified: "unverified, TODO record on a CPU"\n          must: ["_C::cpu_fused_moe"]', "write `verified: no` here"),
], ids=["values-as-a-list", "common-seen-as-a-list", "unsupported-as-a-list", "rejected-as-a-list", "stamp-a-number",
        "stamp-a-todo"])
def test_a_flavour_section_of_the_wrong_shape_or_a_stamp_that_names_no_trace_is_one_line(tmp_path, file, old, new, expect):
    """A list where a mapping belongs was an AttributeError traceback (`pytest --list-configs` printed it), and any
    string under `verified:` (a number, "unverified, TODO") read as verified, so level 1.5's pass vouched for it."""
    d = _copy_configs(tmp_path)
    p = d / file
    assert old in p.read_text(), old
    p.write_text(p.read_text().replace(old, new, 1))
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_malformed_yaml_is_one_clear_line(tmp_path):
    d = _copy_configs(tmp_path)
    (d / "configs.yaml").write_text("configs: [ {moe: gemm,\n")
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    assert "malformed YAML" in str(e.value) and "\n" not in str(e.value)


def test_a_config_file_of_binary_junk_is_one_clear_line(tmp_path):
    """Not UTF-8 (a bad copy): a UnicodeDecodeError traceback from `pytest --list-configs` and any run."""
    d = _copy_configs(tmp_path)
    (d / "axes.yaml").write_bytes(b"axes:\n  \xc8\x00junk")
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    assert str(e.value) == f"{d / 'axes.yaml'}: not UTF-8 text (byte 0xc8 at offset 8); fix the file", str(e.value)


def test_unknown_value_in_a_flavour_file_is_reported(tmp_path):
    d = _copy_configs(tmp_path)
    p = d / "flavours" / "cpu.yaml"
    p.write_text(p.read_text().replace("    cpu:\n      logs", "    cpux:\n      logs"))
    with pytest.raises(SuiteError, match="values.moe: 'cpux' is not one of"):
        Catalog(d)


@pytest.mark.parametrize("flavour, as_list, as_string, key", [
    ("cpu", 'must_not: ["Pregraph bytecode", "AOTDispatcher*"]', 'must_not: "Pregraph bytecode"', "values.graphs.off.kernels.cpu.must_not"),
    ("cpu", 'must: ["_C::cpu_fused_moe"]', 'must: "_C::cpu_fused_moe"', "values.moe.cpu.kernels.cpu.must"),
    ("cpu", 'seen: ["_C::cpu_attention_with_kv_cache"]', 'seen: "_C::cpu_attention_with_kv_cache"', "values.attention.auto.kernels.cpu.seen"),
    ("fork", 'also_runs: ["*GroupProblemShape*MainloopSm120ArrayTmaWarpSpecializedBlockScaled*", "*expandInputRowsKernel*", '
     '"*finalizeMoeRoutingKernel*"]', 'also_runs: "*expandInputRowsKernel*"', "values.moe.gemv.kernels.sm_12x.also_runs"),
    ("cpu", 'logs: ["CPUUnquantizedExperts"]', 'logs: "CPUUnquantizedExperts"', "values.moe.cpu.logs"),
], ids=["must_not", "must", "seen", "also_runs", "logs"])
def test_a_pattern_list_written_as_a_string_is_one_clear_line(tmp_path, flavour, as_list, as_string, key):
    """`must_not: "Pregraph bytecode"` would be read letter by letter, forbidding 'P', 'r', ... and nothing that
    runs: refused in one line naming the file, the key and the list to write instead."""
    d = _copy_configs(tmp_path)
    p = d / "flavours" / f"{flavour}.yaml"
    assert as_list in p.read_text()
    p.write_text(p.read_text().replace(as_list, as_string))
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    msg, written = str(e.value), as_string.split(": ", 1)[1]
    assert msg.startswith(f"{p}: {key}: expected a list of strings") and f"write [{written}]" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("argv, expect", [
    (["--config=nope"], "unknown config 'nope'"),
    (["--model=/no/such/dir"], "no such directory"),
    (["--flavour=nope"], "unknown flavour 'nope'"),
    (["--run-dir=/proc/no-such-dir"], "--run-dir /proc/no-such-dir: cannot write there"),
    (["--run-dir=README.md"], "--run-dir README.md: cannot write there (a file, not a directory)"),  # "(File exists)"
    (["--workloads=/no/such/workloads.yaml"], "--workloads /no/such/workloads.yaml: no such file"),
    (["--model=nobody-has/this-model-xyz"], "--model nobody-has/this-model-xyz: "),
    (["--platform=sm_121"], "use them with --server-url"),
    (["--server-arg=gpu-memory-utilization=0.9"], "--server-arg 'gpu-memory-utilization=0.9': pass one vLLM option"),
    # the suite binds 127.0.0.1 on a port it polls and serves the model under test; argparse keeps the last value
    (["--server-arg=--port=18777"], "--server-arg '--port=18777': the suite sets --port itself"),
    (["--server-arg=--host=0.0.0.0"], "--server-arg '--host=0.0.0.0': the suite sets --host itself"),
    (["--server-arg=--model=other/model"], "the suite sets --model itself"),
    (["--server-url=http://127.0.0.1:9"], "--server-url http://127.0.0.1:9: cannot list models"),
    (["--server-url=127.0.0.1:9"], "--server-url 127.0.0.1:9: write the scheme too, e.g. --server-url=http://127.0.0.1:9"),
    # a port out of range or no host was "cannot list models (InvalidURL ...); is the server up?"
    (["--server-url=http://127.0.0.1:99999"], "--server-url http://127.0.0.1:99999: not a server address; write "
                                              "http://HOST:PORT"),
    (["--server-url=http://"], "--server-url http://: not a server address"),
    # the OpenAI clients' base URL asked for /v1/v1/models, whose 404 said "not an OpenAI-compatible server"
    (["--server-url=http://127.0.0.1:9/v1/"], "--server-url http://127.0.0.1:9/v1/: pass the server's root, without "
                                             "/v1 (the suite adds /v1/...): --server-url=http://127.0.0.1:9"),
    # an empty value (an unset shell variable) ran the default config, or none at all (every test skipped as NOTSET)
    (["--config="], "--config='' names no config; pass --config=NAME[,NAME] or all, or leave the option out"),
    (["--config=,"], "--config=',' names no config"),
    (["--model="], "--model='' is empty; give it a value, or leave the option out for its default"),
    (["--run-dir="], "--run-dir='' is empty"),
    (["-m", "feature", "--feature="], "--feature='' is empty"),
    (["--list-configs", "--flavour="], "--flavour='' is empty"),
    # feature options are checked when the run starts (they once failed inside collection, under pluggy's stack)
    (["-m", "feature", "--feature=nosuch"], "--feature: unknown feature(s) nosuch; known: "),
    (["--config=cpu-bf16", "--against=nosuch"], "--against: unknown config 'nosuch'"),
    (["--config=cpu-bf16", "--against=cpu-bf16-eager", "--criteria=tg32 >>= x"], "criterion 'tg32 >>= x' is not understood"),
])
def test_bad_options_exit_nonzero_with_one_line_and_no_traceback(argv, expect):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv, "tests/unit/test_configs.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert expect in out and "Traceback" not in out
    assert len([l for l in out.splitlines() if l.strip()]) <= 2, out


CPU_RUN = {**os.environ, "SUITE_PLATFORM": "cpu"}  # goldens and default model of a CPU machine, wherever it runs


@pytest.mark.parametrize("value", ["sm_121", "banana"])
def test_a_suite_platform_other_than_cpu_is_one_line_not_ignored(value):
    """SUITE_PLATFORM=sm_121 on an H100 ran as the H100 in silence: only `cpu` means something (run a GPU machine as a
    CPU one); another platform's server is judged with --server-url and --platform."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--list-configs"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "SUITE_PLATFORM": value})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "Traceback" not in out, out
    assert [line for line in out.splitlines() if line.strip()] == [
        f"ERROR: SUITE_PLATFORM='{value}': only `cpu` is known (it runs a GPU machine as a CPU one); unset it, and judge "
        "a server of another platform with --server-url and --platform"], out
    assert subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--list-configs"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SUITE_PLATFORM": "CPU"}
                          ).returncode == 0  # the one value it knows, in any case


@pytest.mark.parametrize("argv, expect", [
    # the review is written after a feature's measurements
    (["--review-dir=/proc/no-such-dir", "tests/unit/test_stats.py"],
     "ERROR: --review-dir /proc/no-such-dir: cannot write there (No such file or directory); pass a writable directory"),
    # the goldens are looked for after the boot (cpu-bf16-eager has level 6 goldens on cpu, no level 2 ones)
    (["-m", "level2", "--co", "--config=cpu-bf16", "--goldens-of=cpu-bf16-eager", "tests/level2_correctness"],
     "ERROR: --goldens-of=cpu-bf16-eager: no level 2 goldens of cpu-bf16-eager for tiny-gpt-oss on cpu (in "
     "goldens/tiny-gpt-oss/cpu/cpu-bf16-eager/); record them first: pytest -m level2 --config=cpu-bf16-eager "
     "--force-regen --model=tiny-gpt-oss"),
    (["--config=cpu-bf16,cpu-bf16", "tests/unit/test_stats.py"], "ERROR: --config names cpu-bf16 twice; name it once"),
], ids=["review-dir-unwritable", "goldens-of-unrecorded", "config-twice"])
def test_options_found_wrong_late_are_one_line_before_the_run(argv, expect):
    """Each was found only after a server booted or a feature was measured; now pytest stops at configure."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=CPU_RUN)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and [line for line in out.splitlines() if line.strip()] == [expect], out


@pytest.mark.parametrize("env, expect", [
    ({"SUITE_SLOT_TIMEOUT": "12h"}, "ERROR: SUITE_SLOT_TIMEOUT='12h': expected seconds above 0 (e.g. 43200 for 12 hours)"),
    ({"SUITE_LOCK_DIR": "/proc/no-such-dir"},
     "ERROR: SUITE_LOCK_DIR /proc/no-such-dir: cannot write there (No such file or directory); pass a writable directory"),
], ids=["slot-timeout-not-seconds", "lock-dir-unwritable"])
def test_slot_settings_found_wrong_at_the_first_boot_are_one_line_before_the_run(env, expect):
    """Both were read when the first server took its slot, after every test before that boot had run (a level 1.5
    kernel run, the unit tests): now pytest stops at configure, and a run with good values goes on."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_stats.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**CPU_RUN, **env})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and [line for line in out.splitlines() if line.strip()] == [expect], out


@pytest.mark.parametrize("argv", [
    ["-m", "level2", "--config=cpu-bf16-eager", "--goldens-of=cpu-bf16", "tests/level2_correctness"],  # recorded
    ["-m", "level1 or level3", "--config=cpu-bf16", "--goldens-of=cpu-bf16-eager"],  # level 2 not selected by -m
    ["--config=cpu-bf16", "--goldens-of=cpu-bf16-eager", "tests/level1_smoke"],  # nor by the paths
    # a shape model has no goldens by design (level 2 skips); a feature's child run passes --goldens-of for it too
    ["-m", "level2", "--model=gpt-oss-20b-shape", "--config=cpu-bf16", "--goldens-of=cpu-bf16-eager"],
], ids=["recorded", "other-levels", "other-folder", "shape-model"])
def test_goldens_of_is_not_refused_where_level_2_has_its_goldens_or_does_not_run(argv):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", *argv],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=CPU_RUN)
    assert r.returncode == 0 and "tests collected" in r.stdout, r.stdout[-1500:] + r.stderr[-1500:]


def test_pytest_help_lists_every_option_of_the_suite():
    """argparse %-formats each help string: a bare % in one (e.g. "3%,") crashed `pytest --help` with a ValueError."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback (most recent call last)" not in r.stdout + r.stderr, r.stderr[-2000:]
    for option in ("--config=", "--force-regen", "--criteria=", "--boot-timeout=", "--goldens-of="):
        assert option in r.stdout, option


@pytest.fixture
def answering_server():
    """A loopback HTTP server whose answer to every GET is what the test sets (a proxy's page, a wrong API)."""
    import http.server
    import threading

    answer = {"type": "text/html", "body": b"<html>it works</html>", "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(answer["status"])
            self.send_header("Content-Type", answer["type"])
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answer
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("content_type, body, argv, expect", [
    ("text/html", b"<html>it works</html>", ["--config=cpu-bf16"],
     "answered HTTP 200 with no JSON ('<html>it works</html>'): not an OpenAI-compatible server at that address); "
     "check the address"),
    ("application/json", b'{"object": "list"}', ["--config=cpu-bf16"],
     "answered without a model list ({'object': 'list'}): not an OpenAI-compatible server at that address); check the"),
    ("application/json", b'{"object": "list", "data": [{"id": "model"}]}', [],
     "--server-url without --config: the server's platform is unknown, so no default config can be picked; pass --config"),
], ids=["html-page", "json-without-a-model-list", "a-server-but-no-config"])
def test_a_server_url_that_is_not_a_vllm_server_or_lacks_its_config_is_one_line(answering_server, content_type, body,
                                                                                argv, expect):
    """A proxy's page or another API at --server-url once ended in an INTERNALERROR (JSONDecodeError, KeyError), and
    a good server without --config named the wrong fix (a default under configs.yaml)."""
    url, answer = answering_server
    answer.update(type=content_type, body=body)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--server-url={url}", *argv,
                        "tests/unit/test_stats.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and expect in out and "Traceback" not in out and "INTERNALERROR" not in out, out
    assert len([line for line in out.splitlines() if line.strip()]) <= 2, out


def _raw_tcp_server(request, reply: bytes | None) -> str:
    """A loopback TCP listener that is no HTTP server: it reads the request, sends `reply` (None: nothing) and closes."""
    def answer(conn, stop) -> None:
        if reply is not None:
            conn.sendall(reply)

    return loopback_server(request, answer)


@pytest.mark.parametrize("reply, said", [
    (None, "accepted the connection and closed it without an HTTP answer"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "answered 'SSH-2.0-OpenSSH_9.6\\r\\n', which is not HTTP"),
    (b"\x00\x15garbage\r\n\r\n", "which is not HTTP"),
], ids=["closes", "another-protocol", "garbage"])
def test_a_server_url_where_something_that_is_not_http_listens_names_the_address_not_a_dead_server(request, reply,
                                                                                                  said):
    """A raw TCP service at --server-url (another program's port, an SSH tunnel's end) was 'is the server up?':
    something is up there, and the fix is the address."""
    from harness.session.suite import external_model

    url = _raw_tcp_server(request, reply)
    with pytest.raises(SuiteError) as e:
        external_model(url, None)
    line = str(e.value)
    assert said in line and line.endswith("check the address (its port)") and "server up" not in line, line
    assert "\n" not in line, line


def test_a_server_url_where_nothing_listens_asks_whether_the_server_is_up():
    from harness.session.suite import external_model

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SuiteError) as e:
        external_model(url, None)
    line = str(e.value)
    assert "nothing listens there (connection refused)" in line and line.endswith("is the server up?"), line


def test_a_web_server_without_v1_models_is_not_an_openai_server(answering_server):
    """A 404 on /v1/models is an answer of some other web server, not a server that is down."""
    from harness.session.suite import external_model

    url, answer = answering_server
    answer["status"] = 404
    with pytest.raises(SuiteError) as e:
        external_model(url, None)
    line = str(e.value)
    assert "answered HTTP 404" in line and line.endswith("check the address (its port)"), line


@pytest.mark.parametrize("argv, env, expect", [
    (["--boot-timeout=0"], {}, "argument --boot-timeout: expected a number above 0, got '0'"),
    (["--level-timeout=-1"], {}, "argument --level-timeout: expected a number above 0, got '-1'"),
    (["--boot-timeout=nan"], {}, "argument --boot-timeout: expected a number above 0, got 'nan'"),
    (["--feature-rounds=-3"], {}, "argument --feature-rounds: expected a whole number above 0, got '-3'"),
    ([], {"SUITE_BOOT_TIMEOUT": "abc"}, "got 'abc' (from the option, or from SUITE_BOOT_TIMEOUT)"),
], ids=["zero-boot-timeout", "negative-level-timeout", "nan-boot-timeout", "negative-rounds", "bad-boot-timeout-variable"])
def test_a_timeout_or_round_count_that_is_not_above_zero_is_pytests_usage_error(argv, env, expect):
    """A zero or negative wait once went through and timed out at once (or never looped); SUITE_BOOT_TIMEOUT=abc
    crashed the suite's plugin while pytest loaded it. Each is now argparse's error naming the option."""
    import os

    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv, "tests/unit/test_stats.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and expect in out and "Traceback" not in out, out


def test_a_path_option_given_with_a_space_outside_the_repo_is_one_line(tmp_path):
    """pytest takes `--run-dir /outside/dir` for its rootdir and misses pytest.ini; the suite's entry-point
    plugin (installed by scripts/setup.sh) says so in one line instead of an 'unrecognized arguments' usage dump."""
    from importlib.metadata import entry_points

    if not any(ep.value == "harness.plugin.options" for ep in entry_points(group="pytest11")):
        pytest.skip("the suite is not installed in this environment (scripts/setup.sh installs it): its options load "
                    "from conftest.py only, after pytest chose the rootdir")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--run-dir", str(tmp_path), "-k", "nothing"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "write --run-dir=<path>" in out and "Traceback" not in out, out
    ok = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--run-dir={tmp_path}",
                         "tests/unit/test_stats.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout[-500:]


def test_list_configs_shows_three_flavours():
    # as on a CPU machine, whatever runs the tests (scripts/test.sh runs them on GPU machines too)
    r = subprocess.run([sys.executable, "-m", "pytest", "--list-configs", "-p", "no:cacheprovider"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "SUITE_PLATFORM": "cpu"})
    assert r.returncode == 0, r.stdout + r.stderr
    # on CPU: the cpu flavour runs; the others say they do not run here and for which platform their data is shown
    for flavour in ("[cpu on cpu] RUNS HERE", "[upstream] not on cpu: ", "[fork] not on cpu: ", "as declared for sm_121:"):
        assert flavour in r.stdout
    assert "cpu-bf16  (default on cpu)" in r.stdout and "RUNS HERE" in r.stdout


def test_server_args_come_after_the_configs_own_and_before_the_suites_perturbations(tmp_path, monkeypatch):
    """--server-arg reaches every boot, placed where vLLM's last-occurrence-wins makes it override the
    config/model value (e.g. the 120b shape's 0.92 memory fraction) but not a secondary server's fraction."""
    import harness.session.suite as suite_mod
    from harness.session.suite import Suite

    seen = {}

    class Stop(Exception):
        pass

    class Recorder:
        def __init__(self, model_path, args, env, log, boot_timeout_s):
            seen["args"] = list(args)
            raise Stop

    monkeypatch.setattr(suite_mod, "VllmServer", Recorder)
    suite = Suite.create(None, None, None, None, str(tmp_path), 60, server_args=["--max-num-seqs=7"])
    target = next(t for t in suite.targets() if t.runnable)
    with pytest.raises(Stop):
        suite.boot(target, args_extra=["--perturbation=1"])
    args = seen["args"]
    assert "--max-num-seqs=7" in args
    assert args.index("--max-num-seqs=7") < args.index("--perturbation=1")
    assert args[:len(target.spec.args)] == list(target.spec.args)


@pytest.mark.parametrize("files, fork", [
    ({"envs.py": "VLLM_MXFP4_MOE_KERNEL: str = 'auto'"}, True),
    ({"envs.py": "VLLM_MXFP4_BACKEND: str | None = None", "config/model.py": ""}, True),  # the deprecated one dropped
    ({"envs.py": "VLLM_USE_V1 = 1", "config/model.py": "    mxfp4_backend: str | None = None"}, True),
    ({"envs.py": "VLLM_USE_V1 = 1", "config/model.py": "    moe_backend: str = 'auto'"}, False),
    ({}, False),
])
def test_the_fork_is_told_from_upstream_by_any_of_its_markers(tmp_path, files, fork):
    """The fork was told by one variable of envs.py that its own mxfp4.py calls deprecated; a fork without it would have
    been served upstream's --moe-backend flags."""
    from harness.config.catalog import _installed_vllm_is_fork

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _installed_vllm_is_fork(tmp_path) is fork


@pytest.mark.parametrize("platform, fork, flavour", [
    ("cpu", True, "cpu"), ("cpu", False, "cpu"), ("sm_90", True, "fork"), ("sm_90", False, "upstream"),
])
def test_the_default_flavour_is_cpu_on_cpu_else_the_fork_where_it_is_installed(catalog, monkeypatch, platform, fork,
                                                                                flavour):
    """Upstream's flavour on the fork (or the reverse) would send the other vLLM's flags and expect its kernels."""
    monkeypatch.setattr("harness.config.catalog._installed_vllm_is_fork", lambda: fork)
    assert catalog.default_flavour(platform).name == flavour


def test_a_value_that_needs_a_model_runs_only_with_that_model(catalog):
    """The fork's Eagle3 drafts exist only for the real gpt-oss-120b: with any other model they must be skipped."""
    fork, base = catalog.flavours["fork"], catalog.parse("marlin-bf16")
    eagle = catalog.make({**base.values, "spec": "eagle3-short"}, "test")
    ok, why = fork.runnable(eagle, "sm_121", "openai/gpt-oss-20b")
    assert not ok and "spec=eagle3-short needs --model openai/gpt-oss-120b" in why
    assert fork.runnable(eagle, "sm_121", "openai/gpt-oss-120b") == (True, "")


def test_a_rejected_combination_is_refused_only_on_the_platforms_its_rule_names(tmp_path):
    """upstream's rule refusing moe=gemm with BF16 activations names sm_12x; narrowed to sm_121, the sm_120 it no
    longer names runs the combination (a rule must not refuse it on every platform where each value runs)."""
    shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    path = tmp_path / "configs" / "flavours" / "upstream.yaml"
    rule = "  - when: {moe: gemm, activation: bf16}\n    platforms: [sm_12x]\n"
    assert rule in path.read_text()
    path.write_text(path.read_text().replace(rule, rule.replace("[sm_12x]", "[sm_121]")))
    catalog = Catalog(tmp_path / "configs")
    up, cfg = catalog.flavours["upstream"], catalog.parse("gemm-bf16")
    assert up.runnable(cfg, "sm_120") == (True, "")
    ok, why = up.runnable(cfg, "sm_121")
    assert not ok and "rejected on sm_121" in why


def test_a_platform_without_a_default_config_is_one_line_naming_the_fix(catalog):
    with pytest.raises(SuiteError, match="no default config for platform sm_75: add it under `defaults`"):
        catalog.default_for("sm_75")
