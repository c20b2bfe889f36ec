"""The decode-time breakdown (harness/kernelpath/breakdown.py): categories from the flavours' data, the busy
fraction as a union of kernel intervals, launches per token, the plot, and the `categories:` section's errors."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from harness.config.catalog import AXIS_CATEGORIES, CONFIG_DIR, Catalog
from harness.core.errors import SuiteError
from harness.kernelpath.breakdown import Breakdown, HostRange, breakdown, categorise, plot_breakdowns, tokens_note

MOE_OGS = "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu"
NVJET = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, "
       "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<192>, cute::C<160>, cute::C<64> >, 64, "
       "cutlass::bfloat16_t, float, cutlass::arch::Sm90, false, true> > > >(void)")
FA3_COMBINE = ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<16>, cute::C<64> >, 5, 256, 1, "
               "false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90> >(flash::FlashAttnFwdCombine<...>::Params)")
OURS = "void (anonymous namespace)::mxfp4_kernel<{}>((anonymous namespace)::Args)"
# FlashInfer's SM120 grouped MoE GEMM: declared by moe=gemm, and a "gemm" the flavours' broad dense glob also matches
GROUPED = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, "
           "int, int> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120ArrayTmaWarpSpecializedBlockScaled"
           "<2, 2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>, "
           "void> > >(void)")


@pytest.fixture(scope="module")
def categories():
    return Catalog().kernel_categories()


@pytest.mark.parametrize("name, expected", [
    (MOE_OGS, "moe"),
    ("void marlin_moe_wna16::Marlin<0l, 0l, 0l, 0l, 256, 1, 8, 8, true, 4, 2, false>(int4 const*)", "moe"),
    (OURS.format("1, 1, 2, 1, 4"), "moe"),  # our MoE gate_up (mode 1)
    (OURS.format("2, 1, 1, 1, 8"), "moe"),  # down (mode 2)
    (OURS.format("0, 1, 2, 1, 4"), "dense"),  # qkv (mode 0), declared by layers=all
    (OURS.format("0, 1, 8, 2, 4"), "dense"),  # lm_head: no layers pattern names it, the flavour's categories do
    ("void vllm::moe::topkGating<8, 8, 4, 16, 32, int, __nv_bfloat16, (vllm::moe::ScoringFunc)0>(void)", "moe"),
    ("void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, __nv_bfloat16, 32, true>(int)", "moe"),
    # an FP4 quantizer (not activation=mxfp8's): the flavours' categories keep it with the MoE it feeds
    ("void flashinfer::quantize_with_block_size<(flashinfer::BlockScaleQuantizationType)0, __nv_bfloat16, 32, true>(int)", "moe"),
    (GROUPED, "moe"),
    (NVJET, "dense"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "dense"),
    (FA3, "attention"),
    (FA3_COMBINE, "attention"),
    ("kernel_unified_attention", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(int)", "attention"),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 3>(c10::BFloat16*)", "other"),
    ("triton_poi_fused_add_mul_0", "other"),
    ("some_kernel_nobody_declared", "other"),
])
def test_kernels_take_the_category_the_catalog_gives_them(categories, name, expected):
    assert categorise(name, categories) == expected


# Every kernel of kernels/csrc/mxfp4_mma.cu by the category its time belongs to. The templated ones take their mode as
# the first argument (0 dense, 1 MoE gate_up, 2 MoE down); the rest are named here, so that a kernel added to the
# source without a category fails below instead of landing in "other" (the wgmma prefill, align_kernel and
# combine_kernel did: a plugin prefill's MoE time was under-counted by their share).
CSRC_MODE_KERNELS = {"mxfp4_kernel": "Args", "mxfp4_pf_kernel": "PfArgs", "mxfp4_wg_kernel": "PfArgs"}
CSRC_MOE_MODE_KERNELS = {"mxfp4_pf_live_kernel": "PfArgs", "mxfp4_wg_live_kernel": "PfArgs"}  # built for modes 1, 2
CSRC_KERNELS = {"xprep_kernel": "dense", "topk_kernel": "moe", "route_kernel": "moe", "align_kernel": "moe",
                "combine_kernel": "moe"}


def test_every_kernel_of_the_cuda_source_has_its_category(categories):
    import re
    src = (Path(__file__).resolve().parents[2] / "kernels" / "csrc" / "mxfp4_mma.cu").read_text()
    names = set(re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\)\)? )?(\w+)\(", src))
    assert names and names == set(CSRC_MODE_KERNELS) | set(CSRC_MOE_MODE_KERNELS) | set(CSRC_KERNELS), (
        f"kernels of mxfp4_mma.cu: {sorted(names)}; give a new one its category in configs/flavours/upstream.yaml "
        "`categories:` and name it here")
    wrong = []
    modes = [(k, a, m, e) for k, a in CSRC_MODE_KERNELS.items() for m, e in ((0, "dense"), (1, "moe"), (2, "moe"))]
    modes += [(k, a, m, "moe") for k, a in CSRC_MOE_MODE_KERNELS.items() for m in (1, 2)]
    for kernel, args, mode, expected in modes:
        name = f"void (anonymous namespace)::{kernel}<{mode}, 16, 1, 2>((anonymous namespace)::{args})"
        wrong += [f"{name} -> {categorise(name, categories)}"] if categorise(name, categories) != expected else []
    for kernel, expected in CSRC_KERNELS.items():
        name = f"void (anonymous namespace)::{kernel}(int const*, int, int)"
        wrong += [f"{name} -> {categorise(name, categories)}"] if categorise(name, categories) != expected else []
    assert not wrong, "\n".join(wrong)


def test_every_seen_kernel_of_an_axis_falls_in_that_axis_category(categories):
    """The data's own real names: what an axis value's trace showed belongs to that axis's category."""
    wrong = []
    for flavour in Catalog().flavours.values():
        for axis, category in AXIS_CATEGORIES.items():
            for value, spec in flavour.values.get(axis, {}).items():
                for selector, exp in (spec.get("kernels") or {}).items():
                    wrong += [f"{flavour.name} {axis}={value} {selector}: {n[:80]} -> {categorise(n, categories)}"
                              for n in exp.get("seen") or [] if categorise(n, categories) != category]
    assert not wrong, "\n".join(wrong)


def test_the_data_drives_the_categories(tmp_path, categories):
    """A test of the test: reorder the entries, or drop the flavours' `categories:`, and known kernels move."""
    assert categorise(GROUPED, categories) == "moe"
    assert categorise(GROUPED, list(reversed(categories))) == "dense"  # the broad "*gemm*" now wins
    d = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, d)
    for name in ("fork", "upstream"):
        p = d / "flavours" / f"{name}.yaml"
        text = p.read_text()
        p.write_text(text[:text.index("\ncategories:\n")] + "\n" + text[text.index("\nvalues:\n"):])
    without = Catalog(d).kernel_categories()
    assert categorise(NVJET, categories) == "dense" and categorise(NVJET, without) == "other"
    assert categorise(FA3_COMBINE, without) == "other" and categorise(FA3, without) == "attention"  # FA3 itself: the axis
    assert categorise(OURS.format("0, 1, 8, 2, 4"), without) == "other"


@pytest.mark.parametrize("section, message", [
    ('categories: ["nvjet_*"]', "categories: expected a mapping of category (moe, dense, attention, other) to a list"),
    ("categories:\n  gemms: [\"nvjet_*\"]", "categories: unknown category 'gemms'; valid categories: moe, dense, attention, other"),
    ('categories:\n  dense: "nvjet_*"', "categories.dense: expected a list of strings, not the string 'nvjet_*'; write [\"nvjet_*\"]"),
    ("categories:\n  dense: [3]", "categories.dense: expected a list of strings"),
], ids=["not-a-mapping", "unknown-category", "string-not-list", "not-strings"])
def test_a_malformed_categories_section_is_one_line(tmp_path, section, message):
    d = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, d)
    p = d / "flavours" / "upstream.yaml"
    text = p.read_text()
    start, end = text.index("\ncategories:\n"), text.index("\nvalues:\n")
    p.write_text(text[:start] + "\n" + section + text[end:])
    with pytest.raises(SuiteError) as e:
        Catalog(d)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and message in msg and "\n" not in msg, msg


def _trace(tmp_path: Path, events: list[dict]) -> Path:
    p = tmp_path / "worker.pt.trace.json.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        json.dump({"schemaVersion": 1, "traceEvents": events}, f)
    return p


def _k(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur}


def _rt(name: str, ts: float) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2}


# Two decode steps, hand-computed: kernel intervals 100-110 (moe) and 105-115 (dense, another stream) overlap,
# 120-125 attention, 130-132 other, 140-150 moe with 142-145 dense nested inside it (a third stream).
# Union = 15 + 5 + 2 + 10 = 32 us; wall = 150 - 100 = 50 us; summed kernel time 40 us.
EVENTS = [
    _rt("cudaGraphLaunch", 95), _k(MOE_OGS, 100, 10), _k(NVJET, 105, 10, stream=13), _k(FA3, 120, 5),
    _rt("cudaLaunchKernel", 128), _k("some_kernel_nobody_declared", 130, 2), _rt("cudaStreamSynchronize", 133),
    _rt("cudaGraphLaunch", 138), _k(MOE_OGS, 140, 10), _k(OURS.format("0, 1, 2, 1, 4"), 142, 3, stream=21),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 101, "dur": 500},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 7, "ts": 160, "dur": 40},
]


def test_per_token_numbers_and_the_busy_union(tmp_path, categories):
    b = breakdown(_trace(tmp_path, EVENTS), categories, tokens=2)
    assert b.us_per_token == {"moe": 10.0, "dense": 6.5, "attention": 2.5, "other": 1.0}
    assert b.total_us_per_token == 20.0  # summed: more than busy, the overlap counted twice
    assert b.wall_us_per_token == 25.0 and b.busy_us_per_token == 16.0 and b.idle_us_per_token == 9.0
    assert b.busy_fraction == pytest.approx(32 / 50)
    assert b.launches_per_token == 3.0  # 6 kernel events
    assert b.graph_launches_per_token == 1.0 and b.host_launches_per_token == 0.5
    assert (b.top[0].name, b.top[0].calls, b.top[0].us_per_token, b.top[0].category) == (MOE_OGS, 2, 10.0, "moe")
    assert [t.category for t in b.top] == ["moe", "dense", "attention", "dense", "other"]
    assert len(b.top[2].name) == 120  # FA3's name, truncated
    # overlaps counted once, the earlier kernel keeping the shared time: 105-110 is moe's, 142-145 inside moe's 140-150
    assert b.exclusive_us_per_token == {"moe": 10.0, "dense": 2.5, "attention": 2.5, "other": 1.0}
    assert sum(b.exclusive_us_per_token.values()) == b.busy_us_per_token
    # host time: the operator's 500 us first, then the runtime calls (2 us each), per token and folded by name
    assert b.host_top[0] == HostRange("aten::mm", "cpu_op", 0.5, 250.0)
    assert b.host_top[1] == HostRange("cudaGraphLaunch", "cuda_runtime", 1.0, 2.0)
    assert {h.name for h in b.host_top} == {"aten::mm", "cudaGraphLaunch", "cudaLaunchKernel", "cudaStreamSynchronize"}
    again = json.loads(json.dumps(b.to_json()))
    assert again["idle_us_per_token"] == 9.0 and Breakdown.from_json(again) == b


def _kc(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return {**_k(name, ts, dur, stream), "args": {"correlation": corr}}


def test_idle_between_launches_is_told_from_idle_inside_one(tmp_path, categories):
    # Step 1: graph replay (correlation 1) 0-10, gap 2, 12-20, then the host waits 30 us; an eager kernel
    # (correlation 2) 50-55, then 5 us later step 2's replay (correlation 3) 60-70, gap 4, 74-80 with a kernel on a
    # second stream 72-78 nested inside the run (it must not end it), and a kernel of another launch nested in 60-70.
    events = [_kc(MOE_OGS, 0, 10, 1), _kc(NVJET, 12, 8, 1), _kc("eager_lm_head", 50, 5, 2),
              _kc(MOE_OGS, 60, 10, 3), _kc(NVJET, 74, 6, 3), _kc(FA3, 72, 6, 3, stream=13),
              _kc("side_stream_kernel", 62, 2, 99, stream=17)]  # nested in 60-70 from another launch: ends nothing
    b = breakdown(_trace(tmp_path, events), categories, tokens=2)
    assert b.wall_us_per_token == 40.0 and b.idle_us_per_token == (2 + 30 + 5 + 2) / 2
    assert b.host_wait_us_per_token == (30 + 5) / 2  # the in-graph gaps (10-12, 70-72) stay out
    # A/A: the same timeline in one launch has no host wait; without correlation ids it is unknown, not zero
    one = [{**e, "args": {"correlation": 9}} for e in events]
    assert breakdown(_trace(tmp_path, one), categories, tokens=2).host_wait_us_per_token == 0.0
    bare = [{k: v for k, v in e.items() if k != "args"} for e in events]
    assert breakdown(_trace(tmp_path, bare), categories, tokens=2).host_wait_us_per_token is None


def test_a_kernel_launched_early_by_pdl_does_not_count_its_wait(tmp_path, categories):
    """Programmatic dependent launch starts a kernel before its predecessor ends; its recorded duration then holds
    the wait. Summed durations count that twice; the exclusive times do not (A/A: without overlap they agree)."""
    topk, gate_up, down = _k(MOE_OGS, 0, 6), _k(MOE_OGS, 1, 24), _k(MOE_OGS, 20, 15)  # gate_up waits 1-6, down 20-25
    b = breakdown(_trace(tmp_path, [topk, gate_up, down]), categories, tokens=1)
    assert b.us_per_token["moe"] == 45.0 and b.exclusive_us_per_token["moe"] == 35.0 == b.busy_us_per_token
    apart = breakdown(_trace(tmp_path, [_k(MOE_OGS, 0, 6), _k(MOE_OGS, 10, 24), _k(FA3, 40, 15)]), categories, tokens=1)
    assert apart.exclusive_us_per_token == {k: v for k, v in apart.us_per_token.items()}
    assert [(t.us_per_token, t.exclusive_us_per_token) for t in apart.top] == [(30.0, 30.0), (15.0, 15.0)]


def test_each_top_kernel_has_its_own_time_with_overlaps_counted_once(tmp_path, categories):
    """Per kernel, as per category: a route kernel started early by PDL during the norm before it holds the norm's
    tail in its duration; its own time starts where the norm ends (the served MoE against the bench's, per kernel)."""
    route, gate_up, down = OURS.format("9, 1, 1, 1, 1"), OURS.format("1, 1, 4, 1, 4"), OURS.format("2, 1, 1, 1, 8")
    events = [_k("triton_red_fused_add_rms_norm", 0, 4), _k(route, 1, 9), _k(gate_up, 8, 14), _k(down, 20, 12),
              _k("triton_red_fused_add_rms_norm", 40, 4), _k(route, 41, 9), _k(gate_up, 48, 14), _k(down, 60, 12)]
    b = breakdown(_trace(tmp_path, events), categories, tokens=2)
    own = {t.name: (t.us_per_token, t.exclusive_us_per_token) for t in b.top}
    # route 1-10 after the norm's 0-4: its own 4-10; gate_up 8-22 after route: 10-22; down 20-32: 22-32
    assert own == {route: (9.0, 6.0), gate_up: (14.0, 12.0), down: (12.0, 10.0), "triton_red_fused_add_rms_norm": (4.0, 4.0)}
    assert sum(e for _, e in own.values()) == b.busy_us_per_token
    again = Breakdown.from_json(json.loads(json.dumps(b.to_json())))
    assert again == b
    old = b.to_json()
    for t in old["top"]:
        del t["exclusive_us_per_token"]  # a breakdown written before the field: read, the field unknown
    assert all(t.exclusive_us_per_token is None for t in Breakdown.from_json(old).top)


def test_a_window_keeps_the_events_that_start_inside_it(tmp_path, categories):
    b = breakdown(_trace(tmp_path, EVENTS), categories, tokens=1, window=(119, 135))
    assert b.us_per_token == {"moe": 0.0, "dense": 0.0, "attention": 5.0, "other": 2.0}
    assert (b.wall_us_per_token, b.busy_us_per_token, b.launches_per_token) == (12.0, 7.0, 2.0)
    assert (b.graph_launches_per_token, b.host_launches_per_token) == (0.0, 1.0)


def test_without_runtime_events_launch_counts_are_unknown(tmp_path, categories):
    b = breakdown(_trace(tmp_path, [e for e in EVENTS if e["cat"] == "kernel"]), categories, tokens=2)
    assert b.graph_launches_per_token is None and b.host_launches_per_token is None and b.launches_per_token == 3.0
    assert b.host_top is None


@pytest.mark.parametrize("events, tokens, message", [
    (EVENTS, 0, "breakdown: tokens is 0; pass the number of decode steps"),
    ([e for e in EVENTS if e["cat"] != "kernel"], 2, "breakdown: no GPU kernel events in"),
])
def test_bad_input_is_one_line(tmp_path, categories, events, tokens, message):
    with pytest.raises(SuiteError) as e:
        breakdown(_trace(tmp_path, events), categories, tokens=tokens)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_plot_is_a_png(tmp_path, categories):
    base = breakdown(_trace(tmp_path, EVENTS), categories, tokens=2)
    feature = breakdown(_trace(tmp_path, EVENTS[:6]), categories, tokens=1)
    path = plot_breakdowns({"triton-bf16 (baseline)": base, "gemv-bf16": feature}, tmp_path / "plots" / "breakdown.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(SuiteError, match="no breakdowns given"):
        plot_breakdowns({}, tmp_path / "empty.png")


def _step(context: tuple[int, int], generation: tuple[int, int], ts: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": ts, "dur": 3,
            "name": f"execute_context_{context[0]}({context[1]})_generation_{generation[0]}({generation[1]})"}


def test_the_steps_vllm_ran_inside_the_trace_are_the_divisor_not_the_callers_count(tmp_path, categories):
    """The client counts a profiled window's tokens a step or two off (in docs/evidence/sm_90-2026-11-26-features/ the
    per-layer kernels ran 24.7 times per counted token on a 24-layer model). vLLM's step ranges say which steps a whole
    trace holds: three decode steps of one token here, where the caller counted two; a prefill step inside is counted
    apart. Where the ranges cannot say (speculative drafts, a window on two clocks) the caller's count stays. A/A: a
    trace without the ranges keeps the caller's count."""
    kernels = [_k(MOE_OGS, 100 * i, 10) for i in range(3)]
    ranges = [_step((0, 0), (1, 1), 100 * i - 5) for i in range(3)]
    b = breakdown(_trace(tmp_path, kernels + ranges), categories, tokens=2)
    assert (b.tokens, b.tokens_source, b.caller_tokens, b.prefill_steps) == (3, "trace", 2, 0)
    assert b.us_per_token["moe"] == 10.0 and b.top[0].calls == 3
    with_prefill = kernels + ranges + [_k(MOE_OGS, 300, 50), _step((1, 16), (0, 0), 295)]
    b = breakdown(_trace(tmp_path, with_prefill), categories, tokens=3)
    assert (b.tokens, b.prefill_steps) == (3, 1) and b.us_per_token["moe"] == 80 / 3
    batched = [_k(MOE_OGS, 100 * i, 10) for i in range(2)] + [_step((0, 0), (4, 4), 100 * i - 5) for i in range(2)]
    assert breakdown(_trace(tmp_path, batched), categories, tokens=1).tokens == 8  # 4 requests' tokens per step
    # speculative decoding: a range counts scheduled tokens (1 + 3 drafts), not generated ones: the caller's count stays
    drafts = kernels + [_step((0, 0), (1, 4), 100 * i - 5) for i in range(3)]
    b_spec = breakdown(_trace(tmp_path, drafts), categories, tokens=5)
    assert (b_spec.tokens, b_spec.tokens_source) == (5, "caller")
    # a window: ranges carry host times, kernels GPU times, so inside a window the caller's count stays too
    b_win = breakdown(_trace(tmp_path, kernels + ranges), categories, tokens=2, window=(-10, 1000))
    assert (b_win.tokens, b_win.tokens_source, b_win.prefill_steps) == (2, "caller", 0)
    # a step with prefill and decode work (chunked prefill beside a decode): its decode token counts, the step as prefill
    mixed = kernels + ranges + [_step((1, 16), (1, 1), 295), _k(MOE_OGS, 300, 50)]
    b_mixed = breakdown(_trace(tmp_path, mixed), categories, tokens=3)
    assert (b_mixed.tokens, b_mixed.prefill_steps) == (4, 1)
    bare = breakdown(_trace(tmp_path, kernels), categories, tokens=2)
    assert (bare.tokens, bare.tokens_source, bare.caller_tokens, bare.prefill_steps) == (2, "caller", 2, None)
    assert bare.us_per_token["moe"] == 15.0
    assert Breakdown.from_json(json.loads(json.dumps(b.to_json()))) == b
    # what a report says about it: the two counts where they differ, and a prefill inside a decode window
    assert tokens_note(breakdown(_trace(tmp_path, kernels + ranges), categories, tokens=2).to_json()) == (
        "per token over the 3 decode tokens of vLLM's step ranges in the trace (the client counted 2)")
    assert "1 prefill step(s)" in tokens_note(b.to_json()) and "client counted" not in tokens_note(b.to_json())
    assert tokens_note(bare.to_json()) is None
