"""Level 6 logic without vLLM: combination generation, exclusions, orthogonality diffs, worker pinning."""
import itertools
import time

import pytest

from harness.config.catalog import Catalog, KernelExpectation
from harness.core.errors import SuiteError
from harness.core.filelock import FileLock
from harness.engine.devices import device_for_worker, worker_index
from harness.kernelpath.traces import KernelStat, KernelSummary
from harness.matrix.combinations import (
    OrthogonalityRules,
    PlatformMatrix,
    load_matrix,
    make_plan,
    orthogonality_diff,
)


@pytest.fixture(scope="module")
def catalog():
    return Catalog()


def _spec(selector, base, vary, max_full=4, neutral=()):
    return PlatformMatrix(selector, base, vary, max_full, list(neutral), "test")


# -- combinations -------------------------------------------------------------------------------
def test_cpu_plan_is_the_base_its_one_axis_neighbours_and_all_off(catalog):
    spec = load_matrix().for_platform("cpu")
    plan = make_plan(catalog, catalog.flavours["cpu"], "cpu", spec)
    assert plan.strategy == "pairwise" and plan.grid_size == 8
    assert plan.names() == ["cpu-bf16", "cpu-bf16-eager", "cpu-bf16-noprefix", "cpu-bf16-nochunk",
                            "cpu-bf16-eager-noprefix-nochunk"]
    assert len(plan.combos) <= 5, "CPU CI budget: at most 5 combinations"
    assert plan.excluded == [] and plan.uncovered == []
    assert [(a.name, b.name, axis) for a, b, axis in plan.pairs()] == [
        ("cpu-bf16", "cpu-bf16-eager", "graphs"),
        ("cpu-bf16", "cpu-bf16-noprefix", "prefix_caching"),
        ("cpu-bf16", "cpu-bf16-nochunk", "chunked_prefill"),
    ]


def test_pairwise_covers_every_value_pair_of_the_grid(catalog):
    spec = load_matrix().for_platform("cpu")
    plan = make_plan(catalog, catalog.flavours["cpu"], "cpu", spec)
    axes = list(plan.axes)
    for a, b in itertools.combinations(axes, 2):
        for va, vb in itertools.product(plan.axes[a], plan.axes[b]):
            assert any(c.config[a] == va and c.config[b] == vb for c in plan.combos), f"{a}={va} with {b}={vb} not covered"


def test_small_grid_runs_the_full_product(catalog):
    spec = load_matrix().for_platform("sm_90")
    plan = make_plan(catalog, catalog.flavours["upstream"], "sm_90", spec)
    assert plan.strategy == "full"
    assert sorted(plan.names()) == sorted(["triton-bf16", "marlin-bf16", "triton-bf16-attn-triton", "marlin-bf16-attn-triton"])
    assert plan.names()[0] == "triton-bf16", "the base comes first"
    assert len(plan.pairs()) == 4  # a 2x2 square has four one-axis edges


def test_combinations_the_flavour_cannot_run_are_excluded_with_its_reason(catalog):
    flavour = catalog.flavours["upstream"]
    spec = _spec("sm_12x", "marlin-bf16", {"moe": ["marlin", "triton"], "tile": ["auto", "64x128"]}, max_full=4)
    plan = make_plan(catalog, flavour, "sm_121", spec)
    assert plan.names() == ["marlin-bf16"]
    reasons = dict(plan.excluded)
    assert set(reasons) == {"triton-bf16", "marlin-bf16-tile64x128", "triton-bf16-tile64x128"}
    for name, why in plan.excluded:
        ok, expected = flavour.runnable(catalog.parse(name), "sm_121")
        assert not ok and why == expected
    assert "triton#8335" in reasons["triton-bf16"]  # upstream's own reason: Triton's ptxas on sm_121a
    assert "exist only in the users' fork" in reasons["marlin-bf16-tile64x128"]
    report = plan.report()
    assert "## excluded (3)" in report and "triton-bf16: " in report


def test_pairwise_reports_value_pairs_only_excluded_combinations_have(catalog):
    spec = _spec("sm_12x", "marlin-bf16", {"moe": ["marlin", "gemm", "triton"], "activation": ["bf16", "mxfp8"],
                                           "attention": ["auto", "triton"]}, max_full=4)
    plan = make_plan(catalog, catalog.flavours["upstream"], "sm_121", spec)
    assert plan.strategy == "pairwise"
    # upstream MXFP8 activations need moe=gemm: marlin/triton with mxfp8 are excluded, so uncoverable
    assert "activation=mxfp8 with moe=marlin" not in plan.uncovered  # pairs are named in axis order
    assert "moe=marlin with activation=mxfp8" in plan.uncovered and "moe=triton with activation=mxfp8" in plan.uncovered
    assert all(catalog.flavours["upstream"].runnable(c.config, "sm_121")[0] for c in plan.combos)
    # every coverable pair is covered
    grid = [c for c in catalog.combinations(list(plan.axes), plan.base.config) if all(c[a] in plan.axes[a] for a in plan.axes)]
    assert len(grid) == plan.grid_size == 12
    runnable = [c for c in grid if catalog.flavours["upstream"].runnable(c, "sm_121")[0]]
    assert len(runnable) + len(plan.excluded) == 12
    for cfg in runnable:
        for a, b in itertools.combinations(plan.axes, 2):
            assert any(c.config[a] == cfg[a] and c.config[b] == cfg[b] for c in plan.combos)


def test_the_base_is_in_the_plan_and_first_even_where_vary_does_not_list_its_value(catalog):
    """`vary: {graphs: ["off"]}` around cpu-bf16 (graphs on) compares eager with the base, not eager alone."""
    plan = make_plan(catalog, catalog.flavours["cpu"], "cpu", _spec("cpu", "cpu-bf16", {"graphs": ["off"]}))
    assert plan.axes == {"graphs": ["on", "off"]} and plan.names() == ["cpu-bf16", "cpu-bf16-eager"]
    assert [(a.name, b.name, axis) for a, b, axis in plan.pairs()] == [("cpu-bf16", "cpu-bf16-eager", "graphs")]


def test_an_unrunnable_base_is_an_error(catalog):
    with pytest.raises(SuiteError, match="the base marlin-bf16 cannot run on cpu"):
        make_plan(catalog, catalog.flavours["cpu"], "cpu", _spec("cpu", "marlin-bf16", {"graphs": None}))


def test_every_platform_of_the_matrix_data_gives_a_plan(catalog):
    data = load_matrix()
    for platform, flavour in (("cpu", "cpu"), ("sm_90", "upstream"), ("sm_121", "fork"), ("sm_121", "upstream"), ("sm_80", "upstream")):
        spec = data.for_platform(platform)
        assert spec is not None, f"no level 6 matrix for {platform}"
        plan = make_plan(catalog, catalog.flavours[flavour], platform, spec)
        assert plan.combos and plan.combos[0].name == spec.base
        assert set(spec.neutral) <= set(plan.axes)


def test_malformed_matrix_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "matrix.yaml"
    bad.write_text("platforms:\n  cpu: {vary: [graphs]}\n")
    with pytest.raises(SuiteError, match="needs `base:`"):
        load_matrix(bad)
    bad.write_text("platforms: {sm90: {base: x, vary: [graphs]}}\n")
    with pytest.raises(SuiteError, match="not a platform selector"):
        load_matrix(bad)


# -- orthogonality --------------------------------------------------------------------------------
def _summary(ops: dict[str, int]) -> KernelSummary:
    total = sum(ops.values())
    return KernelSummary("synthetic", "cpu_op", [KernelStat(n, c, float(c), c / total) for n, c in ops.items()])


COMMON = {"_C::cpu_fused_moe": 128, "_C::cpu_attention_with_kv_cache": 128, "_C::onednn_mm": 416, "aten::slice": 2500}


def _exp(graphs: str) -> KernelExpectation:
    """Expectations shaped like Flavour.resolve's: the moe/attention axes plus the graphs axis."""
    exp = KernelExpectation(must=["_C::cpu_fused_moe", "_C::cpu_attention_with_kv_cache"], must_not=["*marlin*"],
                            source={"_C::cpu_fused_moe": ["moe=cpu"], "*marlin*": ["moe=cpu"],
                                    "_C::cpu_attention_with_kv_cache": ["attention=auto"]})
    if graphs == "on":
        exp.must.append("Pregraph bytecode")
        exp.must_not.append("aten::rsqrt")
        exp.source.update({"Pregraph bytecode": ["graphs=on"], "aten::rsqrt": ["graphs=on"]})
    else:
        exp.must.append("_C::rotary_embedding")
        exp.must_not.append("Pregraph bytecode")
        exp.source.update({"_C::rotary_embedding": ["graphs=off"], "Pregraph bytecode": ["graphs=off"]})
    return exp


@pytest.fixture
def pair(catalog):
    return catalog.parse("cpu-bf16"), catalog.parse("cpu-bf16-eager")


def _diff(pair, a_ops, b_ops, rules=None):
    (ca, cb) = pair
    return orthogonality_diff("cpu-bf16", ca, _summary(a_ops), _exp("on"), "cpu-bf16-eager", cb, _summary(b_ops), _exp("off"),
                              rules or OrthogonalityRules(min_share=0.002, anchor_tolerance=0.15))


def test_a_difference_made_only_of_the_axis_patterns_is_orthogonal(pair):
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**COMMON, "_C::rotary_embedding": 128, "aten::rsqrt": 288})
    assert d.ok, d.explain()
    assert {(o.name, o.explained_by) for o in d.explained} == {
        ("Pregraph bytecode", "Pregraph bytecode (graphs=on must)"),
        ("_C::rotary_embedding", "_C::rotary_embedding (graphs=off must)"),
        ("aten::rsqrt", "aten::rsqrt (graphs=on must_not)"),  # eager-only: compiled graphs forbid it
    }


def test_an_unexplained_extra_kernel_fails_with_a_readable_diff(pair):
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**COMMON, "_C::rotary_embedding": 128, "_C::mystery_gemm": 400})
    assert not d.ok
    text = d.explain()
    assert "NOT orthogonal" in text
    assert "+ _C::mystery_gemm only in cpu-bf16-eager (400 calls" in text
    assert "no graphs pattern explains" in text
    assert [o.name for o in d.unexplained] == ["_C::mystery_gemm"]


def test_a_kernel_of_another_axis_disappearing_is_not_explained_by_this_axis(pair):
    b = {k: v for k, v in COMMON.items() if k != "_C::cpu_fused_moe"}
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**b, "_C::rotary_embedding": 128})
    assert not d.ok
    assert [o.name for o in d.unexplained] == ["_C::cpu_fused_moe"]
    assert any("_C::cpu_fused_moe (moe=cpu): 128 calls in cpu-bf16 vs 0" in c for c in d.count_changes)


def test_other_axes_kernels_must_run_equally_often(pair):
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**COMMON, "_C::cpu_fused_moe": 256, "_C::rotary_embedding": 128})
    assert not d.ok and not d.unexplained
    assert "_C::cpu_fused_moe (moe=cpu): 128 calls in cpu-bf16 vs 256 in cpu-bf16-eager (50.0% apart; tolerance 15%)" in d.explain()
    within = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**COMMON, "_C::cpu_fused_moe": 120, "_C::rotary_embedding": 128})
    assert within.ok, within.explain()
    at_tolerance = _diff(pair, {**COMMON, "_C::cpu_fused_moe": 100, "Pregraph bytecode": 32},
                         {**COMMON, "_C::cpu_fused_moe": 85, "_C::rotary_embedding": 128})  # 15/100 apart
    assert at_tolerance.ok, "a difference of exactly the tolerance is allowed: " + at_tolerance.explain()


def test_tiny_and_listed_ops_are_reported_not_judged(pair):
    rules = OrthogonalityRules(min_share=0.002, ignore={"aten::result_*": "bookkeeping"}, anchor_tolerance=0.15)
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32}, {**COMMON, "_C::rotary_embedding": 128, "aten::select": 5, "aten::result_type": 3000}, rules)
    assert d.ok, d.explain()
    assert [o.name for o in d.below_threshold] == ["aten::select"]
    assert d.ignored == [("aten::result_type", "bookkeeping")]
    assert "below the share threshold: aten::select (cpu-bf16-eager)" in d.explain()


def test_a_one_sided_op_at_exactly_the_share_threshold_is_judged(pair):
    """Only ops *below* min_share are listed without a verdict: one at a quarter of op time with min_share 0.25 fails."""
    anchors = {"_C::cpu_fused_moe": 1, "_C::cpu_attention_with_kv_cache": 1}
    d = _diff(pair, {**anchors, "Pregraph bytecode": 2}, {**anchors, "_C::rotary_embedding": 1, "_C::mystery": 1},
              OrthogonalityRules(min_share=0.25, anchor_tolerance=0.15))
    assert [(o.name, o.share) for o in d.unexplained] == [("_C::mystery", 0.25)]
    assert not d.below_threshold and not d.ok


def test_a_pattern_of_the_wrong_axis_value_explains_nothing(pair):
    # rotary_embedding is declared for graphs=off; appearing on the graphs=on side it is unexplained
    d = _diff(pair, {**COMMON, "Pregraph bytecode": 32, "_C::rotary_embedding": 128}, {**COMMON})
    assert not d.ok
    assert [o.name for o in d.unexplained] == ["_C::rotary_embedding"]
    assert [o.name for o in d.explained] == ["Pregraph bytecode"]


def test_pairs_must_differ_in_exactly_one_axis(catalog):
    a, b = catalog.parse("cpu-bf16"), catalog.parse("cpu-bf16-eager-noprefix")
    with pytest.raises(SuiteError, match=r"differ in \['graphs', 'prefix_caching'\]"):
        orthogonality_diff("a", a, _summary(COMMON), _exp("on"), "b", b, _summary(COMMON), _exp("off"), OrthogonalityRules())


# -- parallel runs --------------------------------------------------------------------------------
def test_xdist_workers_are_pinned_round_robin_to_visible_gpus():
    assert worker_index(None) == 0 and worker_index("master") == 0 and worker_index("gw7") == 7
    assert [device_for_worker(f"gw{i}", ["0", "1"]) for i in range(4)] == ["0", "1", "0", "1"]
    assert device_for_worker("gw1", ["4", "6"]) == "6"  # an existing CUDA_VISIBLE_DEVICES list is honoured
    assert device_for_worker("gw1", []) is None


def test_file_lock_excludes_and_times_out(tmp_path):
    lock = tmp_path / "slot.lock"
    with FileLock(lock, 5, "cpu slot"):
        start = time.monotonic()
        with pytest.raises(SuiteError, match="waited 1 s for the cpu slot"):
            with FileLock(lock, 1, "cpu slot"):
                pass
        assert 0.9 < time.monotonic() - start < 5
    with FileLock(lock, 1, "cpu slot"):  # released: free again
        pass
