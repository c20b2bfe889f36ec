"""Level 1.5 tests of the test, for every config on every platform the data declares (no vLLM).

A synthetic trace is built from the kernel names the flavour data says each backend runs (`seen`, real
names from traces where `verified`, from public sources elsewhere) plus the kernels every config runs
on that platform (`common_seen`). The config's own trace must pass its check; the same trace with one
backend swapped for a sibling's kernels must fail it, and each backend's own patterns must reject the
other's kernels. A pattern too loose to tell backends apart (the old `*cutlass*`, `*marlin*`, or `*moe*`)
fails here before it can pass a wrong run on a real machine.
"""
from __future__ import annotations

import copy
import fnmatch
import itertools

import pytest

from harness.config.catalog import SIBLING_AXES, UNDECLARED, Catalog, KernelExpectation
from harness.core.platform import platform_matches
from harness.kernelpath.traces import (
    KernelStat,
    KernelSummary,
    check_decode,
    check_path,
)
from tests.unit.recordings import catalog_unrecorded_on

CATALOG = Catalog()


def _rejections_lifted(flavour):
    """The flavour as it will be once a value it rejects on a platform, yet declares kernels for there, runs (the fork's
    GEMV MoE, waiting for the users' port): that data is checked now, not on the day it first runs."""
    lifted = copy.deepcopy(flavour)
    for values in lifted.values.values():
        for spec in values.values():
            rejected, kernels = spec.get("rejected") or {}, spec.get("kernels") or {}
            for selector in [s for s in rejected if s in kernels]:
                del rejected[selector]
    return lifted


FLAVOURS = {name: _rejections_lifted(flavour) for name, flavour in CATALOG.flavours.items()}
PLATFORMS = {"cpu": ["cpu"], "upstream": ["sm_90", "sm_121"], "fork": ["sm_121"]}


def _configs():
    """Named configs plus every moe x activation x attention composition (other axes at their defaults)."""
    seen, out = set(), []
    grid = itertools.product(*(CATALOG.axes[a].tokens for a in ("moe", "activation", "attention")))
    extra = [CATALOG.make({"moe": m, "activation": a, "attention": t}, "grid") for m, a, t in grid]
    for cfg in CATALOG.named + extra:
        name = CATALOG.name(cfg)
        if name not in seen:
            seen.add(name)
            out.append(cfg)
    return out


def _cases():
    for flavour_name, platforms in PLATFORMS.items():
        flavour = FLAVOURS[flavour_name]
        for platform in platforms:
            for cfg in _configs():
                if flavour.runnable(cfg, platform)[0] and flavour.resolve(cfg, platform).kernels.must:
                    yield pytest.param(flavour_name, platform, cfg, id=f"{flavour_name}-{platform}-{CATALOG.name(cfg)}")


CASES = list(_cases())


def _summary(names: list[str]) -> KernelSummary:
    return KernelSummary("synthetic", "kernel", [KernelStat(n, 1, 1.0, 1.0 / len(names)) for n in dict.fromkeys(names)])


def test_the_data_declares_cases_on_every_platform():
    platforms = {c.values[1] for c in CASES}
    assert platforms == {"cpu", "sm_90", "sm_121"}, platforms
    assert len(CASES) >= 12


@pytest.mark.parametrize("flavour_name,platform,cfg", CASES)
def test_a_trace_of_the_configs_own_kernels_passes(flavour_name, platform, cfg):
    flavour = FLAVOURS[flavour_name]
    spec = flavour.resolve(cfg, platform)
    v = check_path(_summary(flavour.seen(cfg, platform)), spec.kernels)
    assert v.ok, f"{spec.config_name} on {platform} ({flavour_name}): its own declared kernels fail its check: {v.problems}"


@pytest.mark.parametrize("flavour_name,platform,cfg", CASES)
def test_a_decode_window_of_the_configs_own_kernels_passes_and_one_of_another_moe_fails(flavour_name, platform, cfg):
    """Every config's decode steps are profiled alone, and each required kernel must run there: the full trace let one
    call of a required kernel pass (Marlin's GEMM once, in a prefill) while 1,534 decode calls ran vLLM's Triton MoE.
    Both ways: the config's own kernels pass; the same window with the MoE kernels of another backend fails."""
    flavour = FLAVOURS[flavour_name]
    exp = flavour.resolve(cfg, platform).kernels
    assert exp.decode_must == exp.must
    v = check_decode(_summary(flavour.seen(cfg, platform)), exp)
    assert v.ok and not v.excused, f"{CATALOG.name(cfg)} on {platform} ({flavour_name}): {v.problems}"
    swapped = 0
    for other in (t for t in CATALOG.axes["moe"].tokens if t != cfg["moe"]):
        theirs = flavour.seen(cfg, platform, replace={"moe": other})
        if set(theirs) != set(flavour.seen(cfg, platform)):  # that backend has kernel names on this platform
            problems = check_decode(_summary(theirs), exp).problems
            assert any("no kernel matches required" in p for p in problems), (other, problems)
            swapped += 1
    if not swapped:
        pytest.skip(f"{CATALOG.name(cfg)} on {platform}: no other MoE backend with kernel names here to swap in")


@pytest.mark.parametrize("flavour_name,platform,cfg", CASES)
def test_each_backends_patterns_reject_its_siblings_kernels(flavour_name, platform, cfg):
    """Both directions, with each side's own `must` patterns only (the derived forbidden lists would make
    any check fail and hide a loose pattern): this backend's patterns fail a trace of a sibling's kernels,
    and the sibling's patterns fail a trace of this config's kernels."""
    flavour = FLAVOURS[flavour_name]
    spec = flavour.resolve(cfg, platform)
    own_trace = _summary(flavour.seen(cfg, platform))
    checked = 0
    for axis in SIBLING_AXES:
        own = [p for _, e in flavour.kernel_entries(axis, cfg[axis], platform) for p in e.get("must") or []]
        if not own:
            continue
        for value in CATALOG.axes[axis].tokens:
            if value == cfg[axis] or not flavour.value_runs(axis, value, platform)[0]:
                continue
            theirs = [p for _, e in flavour.kernel_entries(axis, value, platform) for p in e.get("must") or []]
            if not theirs or set(theirs) <= set(own):
                continue  # undeclared there, or the same backend under another name ("auto")
            sibling_trace = _summary(flavour.seen(cfg, platform, replace={axis: value}))
            assert not check_path(sibling_trace, KernelExpectation(must=own)).ok, (
                f"{spec.config_name} on {platform} ({flavour_name}): {axis}={cfg[axis]}'s patterns {own} all match a trace "
                f"of {axis}={value}'s kernels")
            assert not check_path(own_trace, KernelExpectation(must=theirs)).ok, (
                f"{spec.config_name} on {platform} ({flavour_name}): {axis}={value}'s patterns {theirs} all match "
                f"{spec.config_name}'s own kernels")
            assert not check_path(sibling_trace, spec.kernels).ok  # and the full check rejects it too
            checked += 1
    if not checked:
        pytest.skip(f"{spec.config_name}: no sibling backend declared on {platform}")


def _other_layers_kernels(flavour_name: str, platform: str, cfg) -> dict[str, set[str]]:
    """The dense-layer kernels each other layers value declares (and runs) on this platform, beyond this config's."""
    flavour = FLAVOURS[flavour_name]
    own = flavour.declared_patterns("layers", cfg["layers"], platform)
    return {value: theirs for value in CATALOG.axes["layers"].tokens
            if value != cfg["layers"] and flavour.value_runs("layers", value, platform)[0]
            and (theirs := flavour.declared_patterns("layers", value, platform) - own)}


LAYERS_CASES = [c for c in CASES if _other_layers_kernels(*c.values)]


def test_the_data_has_configs_another_layers_value_could_impersonate():
    names = {(CATALOG.name(c.values[2]), c.values[1]) for c in LAYERS_CASES}
    assert ("gemv-bf16", "sm_90") in names, sorted(names)


@pytest.mark.parametrize("flavour_name,platform,cfg", LAYERS_CASES)
def test_a_trace_of_another_layers_values_kernels_fails(flavour_name, platform, cfg):
    """layers=moe keeps the dense layers in BF16 and so declares no kernels of its own; a trace that shows the
    dense MXFP4 kernels another layers value declares (layers=all's qkv/o GEMV) is that other config and must
    fail this config's check, as a sibling MoE or attention backend's kernels do."""
    flavour = FLAVOURS[flavour_name]
    spec = flavour.resolve(cfg, platform)
    for value, theirs in _other_layers_kernels(flavour_name, platform, cfg).items():
        assert not check_path(_summary(flavour.seen(cfg, platform, replace={"layers": value})), spec.kernels).ok, (
            f"{spec.config_name} on {platform} ({flavour_name}): passes a trace of layers={value}'s kernels {sorted(theirs)}")


DECODE_CASES = [c for c in CASES if FLAVOURS[c.values[0]].resolve(c.values[2], c.values[1]).kernels.prefill_only]


def test_the_data_has_configs_that_hand_prefill_to_another_backend():
    names = {CATALOG.name(c.values[2]) for c in DECODE_CASES}
    assert {"gemv-bf16", "gemv-bf16-mxfp4-all"} <= names, names


@pytest.mark.parametrize("flavour_name,platform,cfg", DECODE_CASES)
def test_a_decode_step_on_the_prefill_backend_fails_the_decode_check(flavour_name, platform, cfg):
    """The decode-only rule, both ways on synthetic traces: the config's own kernels pass; the same trace plus
    the kernels of the backend its `also_runs` names (a decode step that fell back) fails, and a trace
    without the config's decode kernels fails."""
    flavour = FLAVOURS[flavour_name]
    exp = flavour.resolve(cfg, platform).kernels
    own = flavour.seen(cfg, platform)
    clean = check_decode(_summary(own), exp)
    assert clean.ok and not clean.excused, f"{CATALOG.name(cfg)} on {platform}: its own kernels fail its decode check"
    fallbacks = 0
    for value in CATALOG.axes["moe"].tokens:
        theirs = [n for _, e in flavour.kernel_entries("moe", value, platform) for n in e.get("seen") or []
                  if value != cfg["moe"] and any(fnmatch.fnmatchcase(n, p) for p in exp.prefill_only)]
        if theirs:
            problems = check_decode(_summary(own + theirs), exp).problems
            assert problems and all(p.startswith("decode steps: forbidden") for p in problems), problems
            fallbacks += 1
    assert fallbacks, f"{CATALOG.name(cfg)} on {platform}: `also_runs` {exp.prefill_only} matches no declared backend's kernels"
    without = [n for n in own if not any(fnmatch.fnmatchcase(n, p) for p in exp.decode_must)]
    assert any("no kernel matches required" in p for p in check_decode(_summary(without), exp).problems)


def test_a_logged_fallback_of_the_decode_kernel_lets_decode_run_the_fallback_backend_excused():
    """The fork's GEMV MoE may fall back to the CUTLASS GEMM with a log line (the users' plan allows it):
    then a decode trace of the GEMM only passes the decode check, but excused: the missing GEMV kernel and each
    GEMM kernel that ran in decode are named with the line, so the run may not record goldens or baselines.
    Without that line it fails on both counts."""
    fork = FLAVOURS["fork"]
    cfg = CATALOG.parse("gemv-bf16")
    exp = fork.resolve(cfg, "sm_121").kernels
    assert exp.prefill_only and exp.excuses
    gemm_decode = _summary(fork.seen(cfg, "sm_121", replace={"moe": "gemm"}))
    log = "WARNING [mxfp4.py] GEMV MoE falling back to the grouped GEMM for this shape"
    v = check_decode(gemm_decode, exp, log)
    assert v.ok and not v.problems
    excused = exp.decode_must + exp.prefill_only
    assert len(v.excused) == len(excused) and all(any(p in x and log in x for x in v.excused) for p in excused), v.excused
    problems = check_decode(gemm_decode, exp, "").problems
    assert any("no kernel matches required" in p for p in problems) and any("forbidden" in p for p in problems), problems
    both = _summary(fork.seen(cfg, "sm_121") + fork.seen(cfg, "sm_121", replace={"moe": "gemm"}))  # some shapes fell back
    v = check_decode(both, exp, log)
    assert v.ok and len(v.excused) == len(exp.prefill_only) and all(any(p in x for x in v.excused) for p in exp.prefill_only)
    v = check_decode(both, exp, "")
    assert not v.ok and not v.excused and all("forbidden" in p for p in v.problems)


def _entries():
    for flavour in CATALOG.flavours.values():
        for axis, values in flavour.values.items():
            for value, spec in values.items():
                for selector, exp in (spec.get("kernels") or {}).items():
                    yield pytest.param(flavour, selector, axis, value, exp, id=f"{flavour.name}-{axis}={value}-{selector}")


@pytest.mark.parametrize("flavour,selector,axis,value,exp", list(_entries()))
def test_every_required_pattern_names_a_seen_kernel_and_no_common_one(flavour, selector, axis, value, exp):
    seen = exp.get("seen") or []
    examples = [p for p in ("cpu", "sm_90", "sm_100", "sm_121") if platform_matches(selector, p)]
    common = [n for sel, ns in flavour.common_seen.items() for n in ns if any(platform_matches(sel, p) for p in examples)]
    for pat in exp.get("must") or []:
        assert any(fnmatch.fnmatchcase(n, pat) for n in seen), (
            f"{flavour.path.name} {axis}={value} [{selector}]: must pattern '{pat}' matches none of its `seen` kernel names; "
            "add the real name it is meant to match")
        loose = [n for n in common if fnmatch.fnmatchcase(n, pat)]
        assert not loose, (f"{flavour.path.name} {axis}={value} [{selector}]: '{pat}' also matches a kernel every config runs "
                           f"({loose[0][:80]}): too loose to name one family")


def test_sibling_patterns_are_forbidden_automatically():
    up = FLAVOURS["upstream"]
    triton = up.resolve(CATALOG.parse("triton-bf16"), "sm_90").kernels
    assert "*marlin_moe_wna16*" in triton.must_not and "moe=marlin" in triton.derived["*marlin_moe_wna16*"]
    marlin = up.resolve(CATALOG.parse("marlin-bf16"), "sm_90").kernels
    assert "_matmul_ogs_*mxfp4*" in marlin.must_not


def test_a_value_vllm_rejects_on_a_platform_says_so():
    up = FLAVOURS["upstream"]
    ok, why = up.runnable(CATALOG.parse("triton-bf16"), "sm_121")
    assert not ok and "rejected on sm_121" in why and "triton#8335" in why
    ok, why = up.runnable(CATALOG.parse("gemm-bf16"), "sm_121")
    assert not ok and "SM90 only" in why


@pytest.mark.parametrize("platform", ["sm_90", "sm_121"])
def test_the_plugin_on_marlins_layout_may_use_vllms_router_but_not_marlins_gemm(platform):
    """On GB10 vLLM's MoE backend is Marlin, which routes in vLLM (its `topkGating` kernel) before the MoE method
    runs, so the plugin's `gemv-bf16` there serves vLLM's top-k (seen on an H200 with --moe-backend=marlin,
    2026-12-02: 128 `topkGating` calls beside our mxfp4_kernel<1/2>). That trace must pass on both platforms;
    the same trace with Marlin's expert GEMM in it (the backend served the experts) must still fail."""
    upstream = FLAVOURS["upstream"]
    cfg = CATALOG.parse("gemv-bf16")
    exp = upstream.resolve(cfg, platform).kernels
    marlin_seen = [n for _, e in upstream.kernel_entries("moe", "marlin", platform) for n in e.get("seen") or []]
    # the name the real trace showed
    router = ["void vllm::moe::topkGating<8, 8, 4, 16, 32, int, __nv_bfloat16, (vllm::moe::ScoringFunc)0>(__nv_bfloat16 "
              "const*, bool const*, float*, int, int*, int*, int, int, int, bool, float const*, double)"]
    own = upstream.seen(cfg, platform)
    v = check_path(_summary(own + router), exp)
    assert v.ok, f"gemv-bf16 on {platform}: vLLM's router beside the plugin's experts fails: {v.problems}"
    gemm = [n for n in marlin_seen if "marlin_moe_wna16" in n]
    assert gemm, f"moe=marlin declares no Marlin GEMM kernel on {platform}"
    v = check_path(_summary(own + router + gemm), exp)
    assert not v.ok and any("marlin_moe_wna16" in p for p in v.problems), v.problems


# -- axis values level 1.5 cannot see ----------------------------------------------------------------------------
def test_an_axis_value_without_kernel_data_is_reported_undeclared_never_passed_unseen():
    """The fork reads no VLLM_MXFP4_ACTIVATION: gemm-mxfp4 launches gemm-bf16's kernels and passed level 1.5 on them
    with nothing saying the activation axis went unchecked."""
    fork = FLAVOURS["fork"]
    status = fork.resolve(CATALOG.parse("gemm-mxfp4"), "sm_121").kernels.verification
    assert status["activation=mxfp4"].startswith(UNDECLARED) and "cannot see" in status["activation=mxfp4"]
    assert "activation=mxfp4" in fork.resolve(CATALOG.parse("gemm-mxfp4"), "sm_121").kernels.unverified
    # a value that launches nothing of its own says so in the data and is not reported
    assert "activation=bf16" not in fork.resolve(CATALOG.parse("gemm-bf16"), "sm_121").kernels.verification
    # every other flavour value on every platform it runs on either declares kernels or says why it has none
    for flavour_name, platforms in PLATFORMS.items():
        for platform in platforms:
            for cfg in _configs():
                if not FLAVOURS[flavour_name].runnable(cfg, platform)[0]:
                    continue
                undeclared = [t for t, s in FLAVOURS[flavour_name].resolve(cfg, platform).kernels.verification.items()
                              if s.startswith(UNDECLARED)]
                assert set(undeclared) <= {"activation=mxfp4", "activation=fp6"}, (flavour_name, platform, undeclared)


def test_the_forks_mxfp4_dense_layers_must_show_dense_marlin_and_layers_moe_must_not():
    """`--mxfp4-layers all` ignored by the fork: its trace is gemm-bf16's, which must fail gemm-bf16-mxfp4-all; and a
    layers=moe config that ran dense Marlin ran MXFP4 dense layers nobody asked for."""
    fork = FLAVOURS["fork"]
    all_layers, plain = CATALOG.parse("gemm-bf16-mxfp4-all"), CATALOG.parse("gemm-bf16")
    exp_all = fork.resolve(all_layers, "sm_121").kernels
    assert check_path(_summary(fork.seen(all_layers, "sm_121")), exp_all).ok
    ignored = check_path(_summary(fork.seen(plain, "sm_121")), exp_all)
    assert not ignored.ok and any("*marlin::Marlin<*" in p for p in ignored.problems)
    ran_dense_marlin = check_path(_summary(fork.seen(all_layers, "sm_121")), fork.resolve(plain, "sm_121").kernels)
    assert not ran_dense_marlin.ok and any("forbidden '*marlin::Marlin<*'" in p for p in ran_dense_marlin.problems)
    # dense Marlin's pattern is not the MoE Marlin's
    moe_marlin = fork.seen(CATALOG.parse("marlin-bf16"), "sm_121")
    assert not any(fnmatch.fnmatchcase(n, "*marlin::Marlin<*") for n in moe_marlin)


@pytest.mark.parametrize("flavour_name", ["fork", "upstream"])
def test_an_fp4_activation_quantizer_does_not_pass_for_mxfp8(flavour_name):
    """FlashInfer's quantize_with_block_size is one template for three conversions (FP16_TO_FP4 = 0, FP8_TO_FP4 = 1,
    FP16_TO_MXFP8 = 2): the MXFP8 check once matched the template's name alone."""
    flavour = FLAVOURS[flavour_name]
    cfg = CATALOG.parse("gemm-mxfp8")
    names = flavour.seen(cfg, "sm_121")
    exp = flavour.resolve(cfg, "sm_121").kernels
    assert check_path(_summary(names), exp).ok
    fp4 = [n.replace("BlockScaleQuantizationType)2,", "BlockScaleQuantizationType)0,") if "quantize_with_block_size" in n else n
           for n in names]
    assert fp4 != names and not check_path(_summary(fp4), exp).ok


def test_a_value_is_verified_only_when_every_entry_that_applies_is():
    """A ">=sm_100" entry verified on a B200 after the sm_12x one (verified: no) once made GB10's read verified."""

    fork = copy.deepcopy(catalog_unrecorded_on("sm_121").flavours["fork"])  # GB10's entry as shipped: unverified
    kernels = fork.mapping("moe", "marlin")["kernels"]
    kernels[">=sm_100"] = {"verified": "NVIDIA B200 (sm_100), vLLM 0.26.0, 2026-12-01", "must": ["*marlin_moe_wna16*"]}
    status = fork.resolve(CATALOG.parse("marlin-bf16"), "sm_121").kernels.verification["moe=marlin"]
    assert status.startswith("unverified (sm_12x"), status
    # with both verified it reads verified
    kernels["sm_12x"] = {**kernels["sm_12x"], "verified": "NVIDIA GB10 (sm_121), vLLM 0.26.0, 2026-12-04"}
    assert fork.resolve(CATALOG.parse("marlin-bf16"), "sm_121").kernels.verification["moe=marlin"].startswith("verified")



def _real_traces() -> dict[str, list[tuple[str, set[str]]]]:
    """(config, kernel names) of every current real trace committed as a fixture, by platform: full traces of
    pairs not marked stale, and decode windows."""
    import json
    from pathlib import Path

    import yaml

    root = Path(__file__).parent / "fixtures" / "recorded"
    out: dict[str, list[tuple[str, set[str]]]] = {}
    for path in sorted(root.glob("*/**/*.json")):
        pair = path.parent / "pair.yaml"
        if pair.is_file() and (yaml.safe_load(pair.read_text()) or {}).get("stale"):
            continue  # recorded before the backend changed (sm_90's gemv-bf16 ran vLLM's Triton MoE for prefill)
        names = {k["name"] for k in json.loads(path.read_text())["summary"]["kernels"]}
        out.setdefault(path.relative_to(root).parts[0], []).append((path.stem, names))
    return out


@pytest.mark.parametrize("platform", sorted(_real_traces()))
def test_no_required_pattern_matches_a_kernel_of_a_real_trace_of_another_value(platform):
    """`common_seen` is written by hand, and the sibling checks cover declared pairs. The real recordings say what
    configs with another value of an axis run: a `must` pattern of moe=marlin matching a kernel of the real triton-bf16
    trace (a review added `*fused_add_rms_norm*` to Marlin's: every data test passed) would pass either backend."""
    traces = _real_traces()[platform]
    assert len(traces) >= 2, f"{platform}: one real trace cannot say what another config runs"
    checked = 0
    for flavour in CATALOG.flavours.values():
        for cfg in CATALOG.named:
            if not flavour.runnable(cfg, platform, None)[0]:
                continue
            exp = flavour.resolve(cfg, platform).kernels
            for config, names in traces:
                other = CATALOG.parse(config)
                for pat in exp.must:
                    for tag in exp.source.get(pat, []):
                        axis, value = tag.split("=", 1)
                        if other[axis] == value:
                            continue
                        loose = sorted(n for n in names if fnmatch.fnmatchcase(n, pat))
                        assert not loose, (f"{flavour.name} {CATALOG.name(cfg)} on {platform}: '{pat}' ({tag}) matches "
                                           f"{loose[0][:100]}, which the real {config} trace ({axis}={other[axis]}) ran")
                        checked += 1
    assert checked, f"{platform}: no pattern was held against a trace of another value"


@pytest.mark.parametrize("variants", [["<0, 1, 1, 1, 6>", "<0, 1, 1, 1, 8>"], ["<0, 1, 4, 1, 6>", "<0, 1, 2, 1, 4>"]],
                         ids=["132-sm-h200", "78-sm-h20"])
def test_mxfp4_dense_layers_are_seen_at_any_sm_count_and_lm_head_alone_is_not(variants):
    """The plugin picks its qkv / o_proj row tiles by the SM count (kernels.cuda_ext.pick_variant): an H20 or a MIG
    slice runs 2 or 4, where a pattern pinned to 1 failed a correct trace and let MXFP4 dense layers pass under
    layers=moe. lm_head's <0, 1, 8, ...> alone (the graph-cache accident on an H200) still fails layers=all."""
    up = FLAVOURS["upstream"]
    name = "void (anonymous namespace)::mxfp4_kernel{}((anonymous namespace)::Args)"
    moe = up.seen(CATALOG.parse("gemv-bf16"), "sm_90")
    dense = [name.format(v) for v in variants]
    lm_head = [name.format("<0, 1, 8, 2, 4>")]
    all_layers = up.resolve(CATALOG.parse("gemv-bf16-mxfp4-all"), "sm_90").kernels
    moe_only = up.resolve(CATALOG.parse("gemv-bf16"), "sm_90").kernels
    assert check_path(_summary(moe + dense + lm_head), all_layers).ok
    assert not check_path(_summary(moe + dense + lm_head), moe_only).ok
    assert not check_path(_summary(moe + lm_head), all_layers).ok
