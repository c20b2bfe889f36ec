"""The platform bring-up recorder (harness/kernelpath/recorder.py, scripts/record_kernels.py) without vLLM.

The recorded-trace tests replay kernel summaries the recorder wrote from real runs
(tests/unit/fixtures/recorded/<platform>/, each with a pair.yaml naming the config and its sibling): the
patterns it verifies must pass level 1.5's check on the recorded config's trace and fail on the sibling's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.catalog import Catalog, entry_rules
from harness.core.errors import SuiteError
from harness.core.platform import detect_platform
from harness.kernelpath import recorder
from harness.kernelpath.traces import KernelStat, KernelSummary, check_decode, check_path

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "fixtures" / "recorded"


@pytest.mark.parametrize("name,fam", [
    ("void marlin_moe_wna16::Marlin<1125899906909960l, 256, 1, 8, true, 4, 2, false>(int4 const*, int4*, int, bool)",
     "marlin_moe_wna16::Marlin"),
    ("void vllm::moe::topkGating<8, 8, 4, 16, 32, int, __nv_bfloat16, (vllm::moe::ScoringFunc)0>(__nv_bfloat16 const*, int)",
     "vllm::moe::topkGating"),
    # generic launchers: the family is the launcher plus the first meaningful type (FA3 is not CUTLASS's MoE)
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cute::tuple<cute::C<1> >, 64> > >(void)",
     "cutlass::device_kernel<flash::FlashAttnFwdSm90>"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<16>, cute::C<64> >, 5, 256> >(flash::FlashAttnFwdCombine<"
     "cute::tuple<cute::C<16> >, 5>::Params)", "cutlass::device_kernel<flash::FlashAttnFwdCombine>"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, "
     "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120ArrayTmaWarpSpecializedBlockScaled<2, 2> >, void> > >(void)",
     "cutlass::device_kernel<cutlass::gemm::GroupProblemShape>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
     "at::native::FillFunctor<float>, std::array<char*, 1ul>)", "at::native::vectorized_elementwise_kernel<at::native::FillFunctor>"),
    ("void at::native::(anonymous namespace)::distribution_kernel<128, 4>(int, float)", "at::native::anon::distribution_kernel"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_12", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", "_matmul_ogs_NNT_bf16xbf16xmxfp4_*_swiglu"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "nvjet_sm90_tst_*_*_*_v_bz_TNT"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_*_*_tn_align8"),
    ("fused_moe_kernel_0x1f2e3d4c", "fused_moe_kernel"),
    ("my_kernel_deadbeef12", "my_kernel"),
    ("_C::cpu_fused_moe", "_C::cpu_fused_moe"),
    ("aten::rsqrt", "aten::rsqrt"),
    ("Pregraph bytecode", "Pregraph bytecode"),
    ("memcpy32_post", "memcpy32_post"),
])
def test_kernel_names_normalise_into_families(name, fam):
    assert recorder.family(name) == fam


def test_a_family_pattern_matches_its_kernels_and_names_one_family():
    name = "void vllm::moe::topkGating<8, int>(float const*, int)"
    pat = recorder.family_pattern(recorder.family(name), name)
    assert pat == "*vllm::moe::topkGating*" and check_path(_summary([name]), _exp(must=[pat])).ok
    assert recorder.family_pattern("aten::rsqrt", "aten::rsqrt") == "aten::rsqrt"
    fa3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cute::tuple<cute::C<1> >, 64> > >(void)")
    moe = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int> >, "
           "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120ArrayTmaWarpSpecializedBlockScaled<2> >, void> > >(void)")
    pat = recorder.family_pattern(recorder.family(fa3), fa3)
    assert pat == "*cutlass::device_kernel<*flash::FlashAttnFwdSm90*"
    assert check_path(_summary([fa3]), _exp(must=[pat])).ok and not check_path(_summary([moe]), _exp(must=[pat])).ok


def _summary(names, kind="cpu_op") -> KernelSummary:
    return KernelSummary("synthetic", kind, [KernelStat(n, 2, 10.0 * (len(names) - i), 0.0) for i, n in enumerate(names)])


def _exp(must=(), must_not=()):
    from harness.config.catalog import KernelExpectation

    return KernelExpectation(must=list(must), must_not=list(must_not))


def _norm(summary: KernelSummary) -> KernelSummary:
    total = sum(k.total_us for k in summary.kernels)
    for k in summary.kernels:
        k.share = k.total_us / total
    return summary


def _recording(cat: Catalog, name: str, names: list[str], sibling: str | None = None, sibling_names=()):
    flavour = cat.flavour("cpu")
    cfg = cat.parse(name)
    spec = flavour.resolve(cfg, "cpu")
    rec = recorder.compare(cat, flavour, cfg, "cpu", "Test CPU", "0.32.0", _norm(_summary(names)), spec.kernels, date="2026-11-22")
    if sibling:
        sib = cat.parse(sibling)
        recorder.diff_sibling(rec, cfg, sibling, sib, _norm(_summary(list(sibling_names))), flavour.resolve(sib, "cpu").kernels)
    return rec


COMPILED = ["_C::cpu_fused_moe", "_C::cpu_attention_with_kv_cache", "Pregraph bytecode", "_C::onednn_mm", "aten::topk",
            "Torch-Compiled Region: 0/1"]
EAGER = ["_C::cpu_fused_moe", "_C::cpu_attention_with_kv_cache", "_C::rotary_embedding", "aten::rsqrt", "aten::embedding",
         "_C::onednn_mm", "aten::topk", "aten::pow"]


def test_the_report_shows_families_the_diff_and_a_proposal():
    cat = Catalog()
    rec = _recording(cat, "cpu-bf16", COMPILED, "cpu-bf16-eager", EAGER)
    assert rec.verdict.ok and not [p for e in rec.entries for p in e.missing]
    assert {f.name for f in rec.uncovered} >= {"Torch-Compiled Region: 0/1", "_C::onednn_mm"}
    assert rec.sibling.axes == {"graphs": ("on", "off")}
    assert {f.name for f in rec.sibling.only_here} == {"Pregraph bytecode", "Torch-Compiled Region: 0/1"}
    assert "_C::rotary_embedding" in {f.name for f in rec.sibling.only_there}
    assert not rec.sibling.sibling_passes_here and not rec.sibling.here_passes_there
    assert rec.can_accept() == (True, "")
    prop = recorder.proposal(rec)
    assert "Pregraph bytecode" in prop["graphs=on"]["must"] and "Torch-Compiled Region: 0/1" in prop["graphs=on"]["must"]
    assert "_C::rotary_embedding" in prop["graphs=on"]["must_not"]
    text = recorder.report(rec)
    for part in ("## Observed kernel families", "declared patterns that matched nothing: none",
                 "observed families no declared pattern covers", "## Against the sibling cpu-bf16-eager (graphs: on here, off in cpu-bf16-eager)",
                 "## Proposed expectation", "--accept"):
        assert part in text, part


def test_the_reports_accept_line_accepts_the_trace_it_shows():
    """docs/GB10.md step 4: accept the reviewed trace with --from-summaries; the report told `the same command with
    --accept`, which boots both servers again and accepts a trace nobody reviewed."""
    rec = _recording(Catalog(), "cpu-bf16", COMPILED, "cpu-bf16-eager", EAGER)
    rec.artifact = "runs/record-cpu-bf16-20261122-010203/cpu-bf16.json"
    line = next(ln for ln in recorder.report(rec).splitlines() if ln.startswith("To accept"))
    assert "`--from-summaries runs/record-cpu-bf16-20261122-010203 --accept`" in line, line
    rec.artifact = ""
    assert "--from-summaries <this recording's run folder> --accept" in recorder.report(rec)


def test_a_sibling_whose_different_trace_the_patterns_cannot_tell_apart_blocks_accepting(tmp_path):
    # the sibling ran a family this config did not (_C::other_moe), yet cpu-bf16's patterns pass on both traces: level 1.5
    # could not see cpu-bf16 fall back to that path, and recording the patterns as verified would vouch for nothing
    cat = Catalog()
    rec = _recording(cat, "cpu-bf16", COMPILED, "cpu-bf16-eager", COMPILED + ["_C::other_moe"])
    assert rec.verdict.ok and rec.sibling.tellable and rec.sibling.here_passes_there
    ok, why = rec.can_accept()
    assert not ok and "cpu-bf16's declared patterns pass on cpu-bf16-eager's trace too, so they cannot tell them apart" in why
    assert "Cannot be accepted yet: the traces of cpu-bf16 and its sibling cpu-bf16-eager differ" in recorder.report(rec)
    with pytest.raises(SuiteError, match="cannot tell them apart"):
        recorder.accept(rec, tmp_path / "cpu.yaml")
    assert not (tmp_path / "cpu.yaml").exists()


def test_a_sibling_that_ran_the_same_kernels_is_reported_and_does_not_block_accepting(tmp_path):
    # e.g. upstream GB10, where attention=auto is Triton attention: the recording still verifies the patterns
    cat = Catalog()
    rec = _recording(cat, "cpu-bf16", COMPILED, "cpu-bf16-eager", COMPILED)
    assert not rec.sibling.tellable and rec.sibling.here_passes_there
    assert rec.can_accept() == (True, "")
    assert "the two runs launched the same kernel families" in recorder.report(rec)
    recorder.accept(rec, tmp_path / "cpu.yaml")
    assert (tmp_path / "cpu.yaml").is_file()


def test_declared_patterns_that_matched_nothing_are_listed_and_block_accepting(tmp_path):
    cat = Catalog()
    rec = _recording(cat, "cpu-bf16", ["_C::cpu_attention_with_kv_cache", "Pregraph bytecode", "_C::some_new_moe"])
    assert [p for e in rec.entries for p in e.missing] == ["_C::cpu_fused_moe"]
    text = recorder.report(rec)
    assert "declared patterns that matched nothing: `_C::cpu_fused_moe`" in text and "Cannot be accepted yet" in text
    with pytest.raises(SuiteError, match="fix the patterns"):
        recorder.accept(rec, tmp_path / "cpu.yaml")
    assert not (tmp_path / "cpu.yaml").exists()


def test_accepting_records_verified_and_seen_in_a_data_file_the_catalog_merges(tmp_path):
    flavour_before = (REPO / "configs" / "flavours" / "cpu.yaml").read_text()
    rec = _recording(Catalog(verified_dir=tmp_path), "cpu-bf16", COMPILED)
    data = recorder.accept(rec, tmp_path / "cpu.yaml")
    assert (REPO / "configs" / "flavours" / "cpu.yaml").read_text() == flavour_before  # never rewritten
    entry = data["values"]["moe"]["cpu"]["kernels"]["cpu"]
    assert entry["verified"] == "Test CPU (cpu), vLLM 0.32.0, 2026-11-22" and entry["seen"] == ["_C::cpu_fused_moe"]
    assert set(data["values"]) == {"moe", "attention", "graphs"}
    cat = Catalog(verified_dir=tmp_path)
    spec = cat.flavour("cpu").resolve(cat.parse("cpu-bf16"), "cpu")
    assert spec.kernels.verification["moe=cpu"].startswith("verified: Test CPU (cpu), vLLM 0.32.0, 2026-11-22 [recorded in ")
    # what the CLI shows
    from types import SimpleNamespace

    from harness.core.platform import Platform
    from harness.report.listing import list_configs

    suite = SimpleNamespace(catalog=cat, platform=Platform("cpu", "Test CPU", None), flavour=cat.flavour("cpu"),
                            model_or_error=SimpleNamespace(alias="tiny-gpt-oss", path=None))
    assert "moe=cpu verified: Test CPU (cpu), vLLM 0.32.0, 2026-11-22 [recorded in" in list_configs(suite)


def test_a_recording_goes_stale_when_the_patterns_change(tmp_path):
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"cpu": {
        "verified": "Old CPU, vLLM 0.31, 2026-01-01", "patterns": ["_C::old_moe"], "seen": ["_C::old_moe"]}}}}}}))
    cat = Catalog(verified_dir=tmp_path)
    status = cat.flavour("cpu").resolve(cat.parse("cpu-bf16"), "cpu").kernels.verification["moe=cpu"]
    assert status.startswith("unverified (the verification recorded in") and "record again" in status


def test_a_recording_with_its_rules_still_goes_stale_when_the_patterns_change(tmp_path):
    """The recorded `rules` (must_not, also_runs, ...) matching the flavour's says nothing of `must`: patterns
    changed since the recording are not what its trace verified."""
    entry = Catalog().flavour("cpu").values["moe"]["cpu"]["kernels"]["cpu"]
    for patterns, verified in ((list(entry["must"]), True), (["_C::old_moe"], False)):
        (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"cpu": {
            "verified": "Old CPU, vLLM 0.31, 2026-01-01", "patterns": patterns, "seen": patterns,
            "rules": entry_rules(entry)}}}}}}))
        cat = Catalog(verified_dir=tmp_path)
        status = cat.flavour("cpu").resolve(cat.parse("cpu-bf16"), "cpu").kernels.verification["moe=cpu"]
        assert status.startswith("verified") is verified, (patterns, status)
        assert verified or ("they changed since" in status and "record again" in status), status


def test_a_run_that_passed_by_a_logged_fallback_cannot_be_accepted(tmp_path):
    """A trace whose `must` kernel is missing passes level 1.5 when the documented fallback was logged, but it never
    showed the pattern match anything: recording it as verified would vouch for a path the run did not take."""
    import dataclasses

    cat = Catalog()
    flavour, cfg = cat.flavour("cpu"), cat.parse("cpu-bf16")
    exp = dataclasses.replace(flavour.resolve(cfg, "cpu").kernels,
                              excuses={"_C::cpu_fused_moe": "(?i)moe.*fall(ing)? ?back"})
    fell_back = [n for n in COMPILED if n != "_C::cpu_fused_moe"]
    rec = recorder.compare(cat, flavour, cfg, "cpu", "Test CPU", "0.32.0", _norm(_summary(fell_back)), exp,
                           server_log="WARNING fused moe falling back to the reference path\n", date="2026-11-22")
    assert rec.verdict.ok and rec.verdict.excused  # level 1.5 passes it
    ok, why = rec.can_accept()
    assert not ok and "passed only by logged fallbacks' excuses" in why, why
    with pytest.raises(SuiteError, match="fell back"):
        recorder.accept(rec, tmp_path / "cpu.yaml")
    assert not (tmp_path / "cpu.yaml").exists()


def test_a_recording_without_its_rules_is_stale_and_with_them_holds():
    """A recording made before `rules` were kept covered the patterns only: moe=gemv on sm_90 was recorded with vLLM's
    Triton MoE as its `also_runs` (before the one-copy plugin), and read as verified after those rules were gone."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rec = {"verified": "Old CPU, vLLM 0.31, 2026-01-01", "patterns": ["_C::cpu_fused_moe"], "seen": ["_C::cpu_fused_moe"]}
        rules = entry_rules(Catalog().flavour("cpu").values["moe"]["cpu"]["kernels"]["cpu"])
        for extra, verified in (({}, False), ({"rules": rules}, True), ({"rules": {**rules, "must_not": ["*x*"]}}, False)):
            Path(d, "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"cpu": {**rec, **extra}}}}}}))
            cat = Catalog(verified_dir=Path(d))
            status = cat.flavour("cpu").resolve(cat.parse("cpu-bf16"), "cpu").kernels.verification["moe=cpu"]
            assert status.startswith("verified") is verified, (extra, status)
            if not extra:
                assert "predates" in status and "record again" in status, status


def test_a_recording_for_an_entry_the_flavour_lacks_is_one_line_error(tmp_path):
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"sm_90": {
        "verified": "x", "patterns": [], "seen": []}}}}}}))
    with pytest.raises(SuiteError, match="has no such kernel entry"):
        Catalog(verified_dir=tmp_path)
    (tmp_path / "cpu.yaml").write_text("values: [broken\n")
    with pytest.raises(SuiteError, match="malformed YAML"):
        Catalog(verified_dir=tmp_path)
    for shape, where in (({"values": ["moe"]}, "cpu.yaml: expected `values:"),
                         ({"values": {"moe": {"cpu": {"kernels": ["cpu"]}}}}, "values.moe.cpu.kernels: expected a mapping")):
        (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(shape))  # a list where a mapping belongs: once AttributeError
        with pytest.raises(SuiteError, match=where):
            Catalog(verified_dir=tmp_path)
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"cpu": {
        "verified": "unverified, TODO", "patterns": ["_C::cpu_fused_moe"], "seen": []}}}}}}))
    with pytest.raises(SuiteError, match="names the trace"):  # any string once read as a verification
        Catalog(verified_dir=tmp_path)


# -- real recorded traces ------------------------------------------------------------------------------
PAIRS = sorted(p.parent for p in RECORDED.glob("*/pair.yaml"))


def _pair(folder: Path):
    meta = yaml.safe_load((folder / "pair.yaml").read_text())
    load = lambda name: KernelSummary.from_json(json.loads((folder / f"{name}.json").read_text())["summary"])  # noqa: E731
    return meta, load(meta["config"]), load(meta["sibling"])


def test_recorded_trace_fixtures_exist():
    assert [p.name for p in PAIRS if p.name == "cpu"], f"no CPU recording under {RECORDED}"


@pytest.mark.parametrize("folder", PAIRS, ids=[p.name for p in PAIRS])
def test_recorded_patterns_pass_level_1_5_for_the_recorded_config_and_fail_for_the_sibling(folder: Path, tmp_path: Path):
    """Replay a real recording (config + sibling), accept it into a temporary verified dir, and check level 1.5's
    expectation built from the recorded data: it passes the recorded config's trace and rejects the sibling's."""
    meta, here, there = _pair(folder)
    if meta.get("stale"):
        pytest.skip(f"{folder.name}: {meta['stale']}")
    platform, vdir = meta["platform"], tmp_path / "verified"
    cat = Catalog(verified_dir=vdir)
    flavour = cat.flavour(meta["flavour"])
    cfg, sib = cat.parse(meta["config"]), cat.parse(meta["sibling"])
    spec, sib_spec = flavour.resolve(cfg, platform), flavour.resolve(sib, platform)
    rec = recorder.compare(cat, flavour, cfg, platform, "recorded", "fixture", here, spec.kernels)
    diff = recorder.diff_sibling(rec, cfg, meta["sibling"], sib, there, sib_spec.kernels)
    assert diff.axes and diff.only_here, "the sibling's trace does not differ: pick a sibling that varies a backend"
    recorder.accept(rec, vdir / f"{meta['flavour']}.yaml")
    cat = Catalog(verified_dir=vdir)  # what pytest and --list-configs load after --accept
    flavour = cat.flavour(meta["flavour"])
    own, theirs = flavour.resolve(cfg, platform).kernels, flavour.resolve(sib, platform).kernels
    assert all(v.startswith("verified: recorded (") and "[recorded in" in v for v in own.verification.values()), own.verification
    assert check_path(here, own).ok, check_path(here, own).problems
    assert not check_path(there, own).ok  # the recorded config's patterns reject the sibling's trace
    assert not check_path(here, theirs).ok  # and the sibling's patterns reject the recorded config's trace
    # the recorded `seen` names are real names of the trace; a synthetic trace of them behaves alike
    names = set(here.names())
    for axis, value in cfg.axes:
        for _, exp in flavour.kernel_entries(axis, value, platform):
            assert set(exp.get("seen") or []) <= names
    kind = here.event_kind
    synthetic = KernelSummary("seen", kind, [KernelStat(n, 1, 1.0, 0.1) for n in flavour.seen(cfg, platform)])
    assert check_path(synthetic, own).ok and not check_path(synthetic, theirs).ok


def test_the_recorder_cli_replays_a_recording_and_accepts_it(tmp_path):
    """scripts/record_kernels.py end to end without a boot (--from-summaries), on CPU's recording."""
    if detect_platform().name != "cpu":
        pytest.skip("replays the CPU recording")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "record_kernels.py"), "--config=cpu-bf16", "--sibling=cpu-bf16-eager",
                        f"--from-summaries={RECORDED / 'cpu'}", f"--run-dir={out}", f"--verified-dir={tmp_path / 'verified'}", "--accept"],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "## Against the sibling cpu-bf16-eager (graphs: on here, off in cpu-bf16-eager)" in r.stdout
    assert (out / "recording.md").is_file() and "accepted: moe=cpu, attention=auto, graphs=on on cpu" in r.stderr
    data = yaml.safe_load((tmp_path / "verified" / "cpu.yaml").read_text())
    assert data["values"]["graphs"]["on"]["kernels"]["cpu"]["seen"] == ["Pregraph bytecode"]
    # stamped with the machine that recorded the trace (the summary says which), not the one replaying it
    assert data["values"]["graphs"]["on"]["kernels"]["cpu"]["verified"].startswith("AMD EPYC (2 cores) (cpu), vLLM 0.32.0")
    listing = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--list-configs"], cwd=REPO,
                             capture_output=True, text=True, timeout=300, env={**_env(), "SUITE_VERIFIED_DIR": str(tmp_path / "verified")})
    assert "moe=cpu verified: " in listing.stdout and "[recorded in " in listing.stdout, listing.stdout[-2000:]


def _env():
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_a_verification_covers_the_entrys_other_rules_and_loosening_one_unverifies_it(tmp_path):
    """A stamp once covered the `must` list alone: an added `also_runs` (the sibling's kernels allowed) or excuse, or a
    dropped `must_not`, kept the loosened entry 'verified'."""
    import copy

    from harness.config.catalog import Catalog
    from harness.kernelpath import recorder
    from harness.kernelpath.traces import KernelStat, KernelSummary

    cat = Catalog()
    flavour = cat.flavours["cpu"]
    cfg = cat.parse("cpu-bf16")
    spec = flavour.resolve(cfg, "cpu")
    names = flavour.seen(cfg, "cpu")
    summary = KernelSummary("t", "cpu_op", [KernelStat(n, 1, 1.0, 1.0 / len(names)) for n in names])
    rec = recorder.compare(cat, flavour, cfg, "cpu", "AMD EPYC (2 cores)", "0.32.0", summary, spec.kernels)
    recorder.accept(rec, tmp_path / "cpu.yaml")
    verified = Catalog(verified_dir=tmp_path)
    assert not verified.flavours["cpu"].resolve(cfg, "cpu").kernels.unverified
    # the same flavour with one entry loosened, the recording unchanged
    loosened = copy.deepcopy(verified.flavours["cpu"])
    entry = loosened.mapping("moe", "cpu")["kernels"]["cpu"]
    entry.pop("stale", None)
    entry["also_runs"] = ["*anything*"]
    loosened._merge_verified(tmp_path / "cpu.yaml")
    assert loosened.resolve(cfg, "cpu").kernels.unverified == ["moe=cpu"]
    assert "other must_not, also_runs" in loosened.resolve(cfg, "cpu").kernels.verification["moe=cpu"]


def _edit(entry: dict, edit: str) -> None:
    if edit == "must pattern added":
        entry["must"] = [*entry["must"], "*a_kernel_no_trace_showed*"]
    elif edit == "allow_excused set":
        entry["allow_excused"] = True
    elif edit == "must_not dropped":
        entry["must_not"] = entry["must_not"][:-1]


@pytest.mark.parametrize("edit", ["nothing", "must pattern added", "allow_excused set", "must_not dropped",
                                  "recorded patterns emptied"])
def test_a_recording_vouches_for_exactly_the_patterns_and_rules_it_covered(tmp_path, edit):
    """A recorded verification holds only while the entry is what its trace was judged by: a `must` pattern added
    since (no trace showed it match), an `allow_excused` turned on (runs passing by a logged fallback may then record
    goldens), a dropped `must_not`, or a recording whose `patterns` are empty (it covered none of them) is stale."""
    import copy

    cat = Catalog()
    flavour, cfg = cat.flavours["cpu"], cat.parse("cpu-bf16")
    assert flavour.mapping("moe", "cpu")["kernels"]["cpu"].get("must_not"), "the premise: the entry has a must_not"
    names = flavour.seen(cfg, "cpu")
    summary = KernelSummary("t", "cpu_op", [KernelStat(n, 1, 1.0, 1.0 / len(names)) for n in names])
    rec = recorder.compare(cat, flavour, cfg, "cpu", "AMD EPYC (2 cores)", "0.32.0", summary, flavour.resolve(cfg, "cpu").kernels)
    recorder.accept(rec, tmp_path / "cpu.yaml")
    if edit == "recorded patterns emptied":
        data = yaml.safe_load((tmp_path / "cpu.yaml").read_text())
        data["values"]["moe"]["cpu"]["kernels"]["cpu"]["patterns"] = []
        (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    edited = copy.deepcopy(Catalog(verified_dir=tmp_path).flavours["cpu"])
    entry = edited.mapping("moe", "cpu")["kernels"]["cpu"]
    for key in ("stale", "verified", "seen", "verified_from"):  # as the flavour file has it, before the merge
        entry.pop(key, None)
    entry["verified"] = "no"
    _edit(entry, edit)
    edited._merge_verified(tmp_path / "cpu.yaml")
    status = edited.resolve(cfg, "cpu").kernels.verification["moe=cpu"]
    assert status.startswith("verified") is (edit == "nothing"), (edit, status)
    assert edit == "nothing" or "record again" in status, status


@pytest.mark.parametrize("stamp, ok", [("Test CPU (cpu), vLLM 0.32.0, 2026-11-22", True),
                                       ("Test CPU (cpu), vLLM 0.32.0, 2026-11-22, to redo: pattern unconfirmed", False),
                                       ("Test CPU (cpu), vLLM 0.32.0, 2026-11-22 TODO", False)])
def test_a_verification_stamp_ends_with_its_date(tmp_path, stamp, ok):
    """The stamp is the whole value: '<device>, vLLM <version>, <date>' and nothing after it. A stamp a hand edit
    extended with a doubt ('..., to redo') was read as verified because it began like one."""
    entry = Catalog().flavour("cpu").values["moe"]["cpu"]["kernels"]["cpu"]
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"values": {"moe": {"cpu": {"kernels": {"cpu": {
        "verified": stamp, "patterns": list(entry["must"]), "seen": [], "rules": entry_rules(entry)}}}}}}))
    if ok:
        cat = Catalog(verified_dir=tmp_path)
        assert cat.flavour("cpu").resolve(cat.parse("cpu-bf16"), "cpu").kernels.verification["moe=cpu"].startswith("verified")
    else:
        with pytest.raises(SuiteError, match="names the trace"):
            Catalog(verified_dir=tmp_path)


@pytest.mark.parametrize("written", ["no", False])
def test_an_entry_written_verified_no_is_unverified_however_yaml_reads_it(written):
    """`verified: no` reads as false in YAML, `verified: "no"` as the string: both say no trace confirmed the
    patterns. The string once made the status 'verified: no', which reads as verified."""
    import copy

    cat = Catalog(verified_dir=Path("/nonexistent"))
    flavour, cfg = copy.deepcopy(cat.flavours["cpu"]), cat.parse("cpu-bf16")
    entry = flavour.mapping("moe", "cpu")["kernels"]["cpu"]
    entry["verified"] = written
    kernels = flavour.resolve(cfg, "cpu").kernels
    assert "moe=cpu" in kernels.unverified and kernels.verification["moe=cpu"].startswith("unverified"), kernels.verification

DECODE_WINDOWS = sorted((RECORDED / "sm_90" / "decode").glob("*.json"))


def test_real_decode_windows_pass_their_own_config_and_no_other():
    """Real decode windows from an H200 (triton, marlin, marlin with Triton attention, the plugin with MXFP4 dense
    layers): each passes its own config's decode check, where every required kernel must run in decode, and fails
    every other's, by the kernel of the backend that did not run."""
    cat = Catalog()
    upstream = cat.flavour("upstream")
    windows = {p.stem: KernelSummary.from_json(json.loads(p.read_text())["summary"]) for p in DECODE_WINDOWS}
    assert len(windows) >= 4, sorted(windows)
    for own, summary in windows.items():
        for name in windows:
            v = check_decode(summary, upstream.resolve(cat.parse(name), "sm_90").kernels)
            assert v.ok is (name == own), (own, name, v.problems)
            if name != own:
                assert v.problems[0].startswith("decode steps: no kernel matches required"), v.problems
