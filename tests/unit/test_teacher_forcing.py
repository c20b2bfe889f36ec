"""Level 2 teacher-forced comparison and golden validation (no vLLM)."""
import json
import math

import pytest

from harness.core.errors import SuiteError
from harness.correctness.level2 import Level2Result, check_golden_data, judge
from harness.correctness.logprobs import Scored, Stream, Tolerance, compare_scored, perplexity_problem

TOL = Tolerance(max_abs=0.25, mean_abs=0.01, ppl_rel=0.002, margin=0.125, source="test")


def _scored(ids, dists):
    """dists[i] = {token: logprob} at position i (>= 1): the top-k, which includes the actual token here."""
    actual = [None] + [d[t] for t, d in zip(ids[1:], dists)]
    return Scored(ids, actual, [{}] + dists)


def _dists(n, shift=0.0, scale=1.0):
    out = []
    for i in range(n):
        base = {10 + i: -0.2, 50: -2.0, 51: -2.5, 52: -3.0, 53: -3.5}
        out.append({t: v * scale + (shift if t == 10 + i else 0.0) for t, v in base.items()})
    return out


IDS = [1] + [10 + i for i in range(40)]


def test_identical_scorings_pass():
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, _dists(40)), TOL, "x")
    assert d.ok and d.max_abs == 0 and d.mean_abs == 0


def test_small_noise_below_the_tolerances_passes():
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, _dists(40, shift=0.005)), TOL, "x")
    assert d.ok and d.mean_abs == pytest.approx(0.005)


def test_a_small_systematic_shift_fails_by_its_mean_although_no_position_is_off():
    """A temperature-like change: every logprob 6% larger; greedy tokens and top-k sets are unchanged."""
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, _dists(40, scale=1.06)), TOL, "x")
    assert d.max_abs < TOL.max_abs and not d.ok
    assert any("mean |delta logprob|" in p for p in d.problems)


def test_one_position_far_off_fails_and_is_named():
    new = _dists(40)
    new[16] = {**new[16], 26: -1.2}
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, new), TOL, "'long'")
    assert not d.ok and d.worst_position == 17 and "'long' position 17" in d.problems[0]


def test_a_token_entering_the_top_k_from_nowhere_fails():
    new = _dists(40)
    new[3] = {13: -0.2, 99: -0.5, 50: -2.0, 51: -2.5, 52: -3.0}  # 99 was not in the golden's top-5, 53 dropped
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, new), TOL, "x")
    assert not d.ok and "token 99 is in the new top-5" in d.problems[0]


def test_a_token_at_the_top_k_boundary_may_swap_places():
    gold, new = _dists(40), _dists(40)
    gold[5] = {15: -0.2, 50: -2.0, 51: -3.0, 52: -4.0, 53: -5.0}
    new[5] = {15: -0.2, 50: -2.0, 51: -3.0, 52: -4.0, 77: -4.99}  # 53 and 77 both sit at the k-th logprob
    assert compare_scored(_scored(IDS, gold), _scored(IDS, new), TOL, "x").ok


def test_positions_after_a_stream_divergence_are_still_judged():
    """Teacher forcing scores the golden's own continuation, so a late fault is seen whatever the stream did."""
    new = _dists(40)
    new[35] = {t: v - 1.0 for t, v in new[35].items()}
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, new), TOL, "x")
    assert not d.ok and d.worst_position == 36


def test_the_first_scored_position_is_judged():
    """Position 0 has no context and is skipped; position 1, the first token with one, is judged like any other."""
    new = _dists(40)
    new[0] = {**new[0], 50: -2.0 - 4 * TOL.max_abs}
    d = compare_scored(_scored(IDS, _dists(40)), _scored(IDS, new), TOL, "x")
    assert not d.ok and d.worst_position == 1 and d.problems[0].startswith("x position 1: "), d.problems


def test_the_golden_token_outside_both_top_ks_is_held_to_max_abs():
    """The token that is there is often ranked below both top-k lists; its own logprob moving 3 nats at one position
    among hundreds fails that position, although the mean over all of them stays inside mean_abs."""
    n = 400
    ids = [1] + [1000 + i for i in range(n)]
    top = [{}] + [{50: -0.5, 51: -1.5, 52: -2.5} for _ in range(n)]
    gold = Scored(ids, [None] + [-6.0] * n, top)
    moved = [None] + [-6.0] * n
    moved[200] = -9.0
    d = compare_scored(gold, Scored(ids, moved, top), TOL, "x")
    assert d.mean_abs < TOL.mean_abs and d.max_abs == pytest.approx(3.0)
    assert not d.ok and d.worst_position == 200 and "x position 200: token 1199" in d.problems[0], d.problems


@pytest.mark.parametrize("gold5, new5", [
    ({15: -0.70, 50: -0.75}, {50: -0.55, 15: -0.90}),  # a tie in the golden, a clear preference in the new run
    ({15: -0.55, 50: -0.90}, {50: -0.70, 15: -0.75}),  # and the other way round
])
def test_the_top_1_may_change_only_on_a_near_tie_on_both_sides(gold5, new5):
    """A top-1 change is a near tie only when neither side prefers its top-1 by more than the margin; every token
    here moves less than max_abs, so only that rule can see it."""
    rest = {51: -2.5, 52: -3.0, 53: -3.5}
    gold, new = _dists(40), _dists(40)
    gold[5], new[5] = {**gold5, **rest}, {**new5, **rest}
    d = compare_scored(_scored(IDS, gold), _scored(IDS, new), TOL, "x")
    assert d.max_abs < TOL.max_abs
    assert not d.ok and "top-1 changed from 15 to 50 without a near tie" in d.problems[0], d.problems
    gold[5], new[5] = {15: -0.70, 50: -0.75, **rest}, {50: -0.70, 15: -0.75, **rest}  # a tie on both sides
    assert compare_scored(_scored(IDS, gold), _scored(IDS, new), TOL, "x").ok


@pytest.mark.parametrize("times, ok", [(0.9, True), (1.1, False)])
def test_a_token_missing_from_the_other_top_k_is_excused_only_within_the_slack(times, ok):
    """A token near the k-th logprob may drop out of the other side's top-k (the last places swap on noise); one
    further above the k-th than the slack (twice max_abs: a drift within max_abs on each side) that drops out is a
    moved distribution."""
    kth, slack = -5.0, 2 * TOL.max_abs
    gold, new = _dists(40), _dists(40)
    gold[5] = {15: -0.2, 50: -2.0, 51: -3.0, 52: kth + times * slack, 53: kth}
    new[5] = {15: -0.2, 50: -2.0, 51: -3.0, 77: kth + times * slack, 53: kth}
    d = compare_scored(_scored(IDS, gold), _scored(IDS, new), TOL, "x")
    assert d.ok is ok and (ok or "token 52 is in the golden top-5" in d.problems[0]), d.problems


@pytest.mark.parametrize("times, ok", [(0.9, True), (1.1, False)])
def test_perplexity_is_held_to_ppl_rel_either_way(times, ok):
    """Held-out perplexity just inside ppl_rel of the golden's is the same model, just beyond it (higher or lower)
    is not."""
    for sign in (1, -1):
        problem = perplexity_problem(8.0, 8.0 * (1 + sign * times * TOL.ppl_rel), 100, TOL)
        assert (problem is None) is ok, problem


def test_a_perplexity_that_is_not_a_number_fails():
    """NaN compares False with every tolerance: a run whose held-out perplexity is NaN would pass."""
    for bad in (math.nan, math.inf):
        assert "perplexity" in perplexity_problem(8.0, bad, 100, TOL)


def test_different_sequences_cannot_be_compared():
    with pytest.raises(SuiteError, match="different token sequences"):
        compare_scored(_scored(IDS, _dists(40)), _scored(IDS[:-1], _dists(39)), TOL, "x")


def test_scored_from_vllm_prompt_logprobs_keeps_the_top_k_only():
    ids = [5, 6, 7]
    raw = [None,
           {"6": {"logprob": -0.5, "rank": 1}, "9": {"logprob": -1.0, "rank": 2}},
           {"7": {"logprob": -6.0, "rank": 40}, "3": {"logprob": -0.1, "rank": 1}, "4": {"logprob": -2.5, "rank": 2}}]
    s = Scored.from_prompt_logprobs(ids, raw, k=2)
    assert s.actual == [None, -0.5, -6.0] and s.top[2] == {3: -0.1, 4: -2.5}
    assert s.perplexity() == pytest.approx(math.exp(3.25))


def _golden():
    stream = Stream([10, 11], [-0.2, -0.2], [{10: -0.2}, {11: -0.2}], "ab", [1])
    ids = [1, 10, 11]
    sc = _scored(ids, _dists(2))
    return Level2Result({"p": stream}, {"p": sc, "perplexity_text": sc}, "self").to_golden()


def test_judge_combines_every_rule():
    gold = _golden()
    same = Level2Result.from_golden(gold, "golden")
    assert judge(same, gold, TOL).ok
    shifted = Level2Result.from_golden(gold, "golden")
    shifted.scored["perplexity_text"] = _scored([1, 10, 11], _dists(2, shift=-0.3))
    v = judge(shifted, gold, TOL)
    assert not v.ok and any("perplexity" in p for p in v.problems) and any("tolerances:" in p for p in v.problems)


@pytest.mark.parametrize("broken", [
    lambda g: g.pop("streams"),
    lambda g: g.pop("scored"),
    lambda g: g["scored"].pop("perplexity_text"),
    lambda g: g["streams"]["p"].pop("tokens"),
    lambda g: g.__setitem__("perplexity", "high"),
    # lengths: every position has its token, logprob and top-k
    lambda g: g["scored"]["p"]["actual"].pop(),
    lambda g: g["scored"]["p"]["top"].pop(),
    lambda g: g["streams"]["p"]["logprobs"].pop(),
    lambda g: g["streams"]["p"]["top"].pop(),
    # types and finite numbers (a NaN compares false with every tolerance, so it would pass anything)
    lambda g: g["scored"]["p"]["actual"].__setitem__(1, "x"),
    lambda g: g["scored"]["p"]["ids"].__setitem__(1, "10"),
    lambda g: g["scored"]["p"]["actual"].__setitem__(2, float("nan")),
    lambda g: g["scored"]["p"]["top"][1].__setitem__(0, [50, float("-inf")]),
    lambda g: g["streams"]["p"]["logprobs"].__setitem__(0, float("nan")),
    lambda g: g["streams"]["p"]["top"][0].__setitem__("10", float("nan")),
    lambda g: g["streams"]["p"].__setitem__("text", None),
    lambda g: g["perplexity"].__setitem__("value", float("nan")),
    # None only where the format has no context (position 0); a top-k everywhere else
    lambda g: g["scored"]["p"]["actual"].__setitem__(2, None),
    lambda g: g["streams"]["p"]["logprobs"].__setitem__(1, None),
    lambda g: g["scored"]["p"]["top"].__setitem__(2, []),
    # one stream and one scoring per prompt: else teacher forcing of that prompt is silently skipped
    lambda g: g["scored"].pop("p"),
    lambda g: g["streams"].pop("p"),
])
def test_a_malformed_golden_is_one_line_naming_the_file(broken):
    gold = json.loads(json.dumps(_golden()))  # entries share no lists: break exactly one
    broken(gold)
    with pytest.raises(SuiteError) as e:
        check_golden_data(gold, "golden goldens/m/cpu/c/level2.json")
    msg = str(e.value)
    assert "goldens/m/cpu/c/level2.json is malformed" in msg and "--force-regen" in msg and "\n" not in msg


def test_a_golden_needs_one_stream_and_one_scoring_per_workload_prompt():
    gold = _golden()
    assert check_golden_data(gold, "golden g.json", prompts={"p": "text"}) is gold
    for prompts in ({"p": "text", "q": "a prompt the golden never saw"}, {}):
        with pytest.raises(SuiteError, match=r"g.json is malformed.*--force-regen") as e:
            check_golden_data(gold, "golden g.json", prompts=prompts)
        assert "\n" not in str(e.value)


def test_every_committed_golden_passes_the_checks():
    from pathlib import Path

    from harness.correctness.level2 import PROMPTS_FILE, load_workload

    tests = Path(PROMPTS_FILE).parents[1]
    prompts = {"level2": load_workload().prompts, "level6": load_workload(tests / "level6_matrix" / "workload.yaml").prompts}
    files = sorted((tests.parent / "goldens").glob("*/*/*/level[26].json"))
    assert files
    for path in files:
        check_golden_data(json.loads(path.read_text())["data"], f"golden {path}", prompts=prompts[path.stem])


def test_every_committed_workload_loads_and_level6_judges_with_level2s_tolerances():
    from pathlib import Path

    from harness.correctness.level2 import PROMPTS_FILE, load_workload

    level2 = load_workload()
    level6 = load_workload(Path(PROMPTS_FILE).parents[1] / "level6_matrix" / "workload.yaml")
    for platform in ("cpu", "sm_90", "sm_121"):
        assert level6.tolerance(platform) == level2.tolerance(platform)


def test_a_workload_whose_tolerances_name_itself_is_one_line(tmp_path):
    from harness.correctness.level2 import load_workload

    own = tmp_path / "w.yaml"
    own.write_text(f"max_tokens: 4\ntop_logprobs: 5\nprompts: {{a: x}}\nperplexity_text: y\ntolerances: {{same_as: {own}}}\n")
    with pytest.raises(SuiteError, match="names the file itself"):
        load_workload(own)
