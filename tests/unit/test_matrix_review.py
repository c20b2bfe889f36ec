"""Level 6 after the review of its plan and data (review findings 5 and 6), without vLLM.

- Every platform and flavour the data declares gets a plan whose every varied value that runs is in a one-axis pair
  or listed, with its reason, in the report: CI on CPU checks GB10's plans too (a user's first GB10 run must not be
  red because of our matrix data).
- pairwise() finds another partner for a value whose one-axis neighbour of the base is excluded, and names why a
  value has none.
- A malformed matrix.yaml is one SuiteError naming the file and the key, never a traceback at collection.
"""
from __future__ import annotations

import dataclasses

import pytest

from harness.config.catalog import Catalog, Config
from harness.core.errors import SuiteError
from harness.core.platform import platform_matches
from harness.matrix.combinations import (MATRIX_FILE, Combo, PlatformMatrix, load_matrix, make_plan, one_axis_pairs, pairwise,
                                      partner_every_value)
from tests.level6_matrix.pairing import listed_unpaired, pairing_problems


def _example_platforms(selector: str) -> list[str]:
    """The platform names a selector stands for: itself, a family's every digit (sm_12x: sm_120 ... sm_129), a lower
    bound's bound (>=sm_100: sm_100)."""
    s = selector.strip()
    if s.startswith(">="):
        return [s[2:].strip()]
    if "x" in s:
        return [s.replace("x", d) for d in "0123456789"]
    return [s]


def _declared_cases() -> list[tuple[str, str]]:
    """(platform, flavour) for every platform the matrix file or a flavour names and every flavour that runs there:
    the plans users get (the flavour defaults to fork or upstream on a GPU, whichever vLLM is installed)."""
    catalog, data = Catalog(), load_matrix()
    selectors = [m.selector for m in data.platforms] + [s for f in catalog.flavours.values() for s in f.platforms]
    platforms = sorted({p for s in selectors for p in _example_platforms(s)})
    return [(p, f.name) for p in platforms for f in catalog.flavours.values()
            if data.for_platform(p) is not None and any(platform_matches(s, p) for s in f.platforms)]


CASES = _declared_cases()


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def _plan(catalog: Catalog, platform: str, flavour: str):
    return make_plan(catalog, catalog.flavours[flavour], platform, load_matrix().for_platform(platform))


# -- the data: every declared platform and flavour -------------------------------------------------------------------
def test_the_cases_reach_every_matrix_entry_and_both_gb10_flavours():
    """A guard on the derivation above: an entry no example platform selects would never be checked."""
    data = load_matrix()
    assert {data.for_platform(p).selector for p, _ in CASES} == {m.selector for m in data.platforms}
    assert {("sm_121", "fork"), ("sm_121", "upstream")} <= set(CASES)


@pytest.mark.parametrize("platform,flavour", CASES, ids=[f"{p}-{f}" for p, f in CASES])
def test_every_value_a_plan_runs_is_paired_or_listed_with_its_reason(catalog, platform, flavour):
    plan = _plan(catalog, platform, flavour)
    problems = pairing_problems(plan)
    assert not problems, f"{platform}/{flavour}:\n  " + "\n  ".join(problems) + "\n" + plan.report()


@pytest.mark.parametrize("platform,flavour", CASES, ids=[f"{p}-{f}" for p, f in CASES])
def test_every_varied_axis_runs_two_values(catalog, platform, flavour):
    """An axis with one runnable value varies nothing there (tile on sm_12x, whose 64x128 neither flavour maps): its
    value can never be paired, and `vary` should not name it for that platform."""
    plan = _plan(catalog, platform, flavour)
    single = {axis: sorted({c.config[axis] for c in plan.combos}) for axis in plan.axes}
    single = {axis: values for axis, values in single.items() if len(values) < 2}
    assert not single, (f"{platform}/{flavour}: {load_matrix().path} varies {sorted(single)}, but only {single} runs "
                        f"there: drop the axis or give the platform its own entry")


# -- the check itself can fail -----------------------------------------------------------------------------------------
def _coupled_plan(catalog: Catalog):
    """Upstream vLLM on GB10 couples moe=gemm with activation=mxfp8 (configs/flavours/upstream.yaml): no runnable pair
    varies either alone, so the plan must list them."""
    spec = PlatformMatrix("sm_12x", "marlin-bf16", {"moe": ["marlin", "gemm", "gemv"], "activation": ["bf16", "mxfp8"]},
                          4, [], "test")
    return make_plan(catalog, catalog.flavours["upstream"], "sm_121", spec)


def test_the_check_fails_a_plan_whose_report_does_not_list_an_unpaired_value(catalog):
    plan = _coupled_plan(catalog)
    assert "gemm-mxfp8" in plan.names()
    assert not pairing_problems(plan)
    unlisted = dataclasses.replace(plan, unpaired=[u for u in plan.unpaired if u[:2] != ("moe", "gemm")])
    problems = pairing_problems(unlisted)
    assert len(problems) == 1 and problems[0].startswith("moe=gemm runs (gemm-mxfp8")
    assert "moe" in {axis for _, _, axis in plan.pairs()}, "the old per-axis check passes here: moe is paired via marlin~gemv"


def test_the_check_fails_a_plan_that_lists_a_paired_value(catalog):
    plan = _coupled_plan(catalog)
    paired = next(a.config["moe"] for a, _, axis in plan.pairs() if axis == "moe")
    wrong = dataclasses.replace(plan, unpaired=[*plan.unpaired, ("moe", paired, "made up")])
    assert f"moe={paired} is listed as unpaired but is in a one-axis pair" in pairing_problems(wrong)


def test_the_report_names_why_a_coupled_value_has_no_partner(catalog):
    plan = _coupled_plan(catalog)
    listed = listed_unpaired(plan.report())
    assert set(listed) == {"moe=gemm", "activation=bf16", "activation=mxfp8"}
    flavour = catalog.flavours["upstream"]
    # each reason quotes the flavour's own reason for excluding the value's neighbours
    ok, why = flavour.runnable(catalog.parse("gemm-bf16"), "sm_121")
    assert not ok and why.split(": ", 1)[1] in listed["activation=mxfp8"]
    ok, why = flavour.runnable(catalog.parse("marlin-mxfp8"), "sm_121")
    assert not ok and why.split(": ", 1)[1] in listed["moe=gemm"]


# -- pairwise(): another partner when the base's neighbour is excluded -------------------------------------------------
AXES = ["graphs", "prefix_caching", "chunked_prefill"]


def _cpu_grid(catalog: Catalog) -> tuple[Config, list[Config]]:
    base = catalog.make(catalog.parse("cpu-bf16").values, "test")
    return base, catalog.combinations(AXES, base)


def _pairs(catalog: Catalog, chosen: list[Config]) -> set[tuple[frozenset, str]]:
    combos = [Combo(catalog.name(c), c, {}) for c in chosen]
    return {(frozenset((a.name, b.name)), axis) for a, b, axis in one_axis_pairs(combos)}


def test_pairwise_adds_a_partner_where_the_base_neighbour_is_excluded(catalog):
    # eager runs only with prefix caching and chunked prefill both off: cpu-bf16-eager, the base's graphs neighbour,
    # is excluded, and the covering set alone pairs graphs=off with nothing (the old pairwise stopped there)
    base, grid = _cpu_grid(catalog)
    why_not = {c: "eager needs both off" for c in grid
               if c["graphs"] == "off" and "on" in (c["prefix_caching"], c["chunked_prefill"])}
    runnable = [c for c in grid if c not in why_not]
    chosen, uncovered, unpaired = pairwise(base, AXES, runnable, grid, why_not)
    assert unpaired == [] and all(c in runnable for c in chosen)
    graphs_pairs = {names for names, axis in _pairs(catalog, chosen) if axis == "graphs"}
    assert frozenset(("cpu-bf16-noprefix-nochunk", "cpu-bf16-eager-noprefix-nochunk")) in graphs_pairs
    assert len(chosen) == len(set(chosen)), "a combination was added twice"


def test_pairwise_names_why_a_value_has_no_partner(catalog):
    base, grid = _cpu_grid(catalog)
    why_not = {c: "eager needs both off" for c in grid
               if c["graphs"] == "off" and "on" in (c["prefix_caching"], c["chunked_prefill"])}
    # ... and the one graphs=on combination that could partner the all-off eager one is excluded too
    noprefix_nochunk = next(c for c in grid if c["graphs"] == "on" and c["prefix_caching"] == c["chunked_prefill"] == "off")
    why_not[noprefix_nochunk] = "no prefix cache without chunks (test)"
    runnable = [c for c in grid if c not in why_not]
    chosen, _, unpaired = pairwise(base, AXES, runnable, grid, why_not)
    # neither graphs value has a partner now: each reason is the exclusion of the other side
    why = {value: reason for axis, value, reason in unpaired if axis == "graphs"}
    assert [(a, v) for a, v, _ in unpaired] == [("graphs", "on"), ("graphs", "off")]
    assert "no prefix cache without chunks (test)" in why["off"] and "eager needs both off" not in why["off"]
    assert "eager needs both off" in why["on"]
    assert any(c["graphs"] == "off" for c in chosen), "the value still runs; only its orthogonality is unchecked"


def test_values_a_partner_pair_brings_along_are_paired_too_or_listed():
    """The pair that partners c=1 is the only runnable one, (a=3, b=3) with c=1 and c=2: it brings a=3 and b=3 into the
    plan after their axes were looked at. They must be paired in turn (here: impossible) or listed as unpaired, never
    run unjudged and unlisted."""
    axes = ["a", "b", "c"]

    def cfg(a, b, c):
        return Config((("a", a), ("b", b), ("c", c)))
    grid = [cfg(a, b, c) for a in "123" for b in "123" for c in "12"]
    runnable = [cfg("1", "1", "1"), cfg("2", "1", "1"), cfg("1", "2", "1"), cfg("3", "3", "1"), cfg("3", "3", "2")]
    why_not = {c: "excluded (test)" for c in grid if c not in runnable}
    chosen, unpaired = partner_every_value(runnable[:3], axes, runnable, grid, why_not)
    assert chosen == runnable
    assert [(axis, value) for axis, value, _ in unpaired] == [("a", "3"), ("b", "3")]


# -- malformed matrix.yaml: one line naming the file and the key --------------------------------------------------------
CPU = "platforms:\n  cpu:\n    base: cpu-bf16\n"
MALFORMED = {
    "vary value unquoted on (YAML bool)": (CPU + "    vary: {graphs: on}\n", "vary.graphs"),
    "vary a scalar": (CPU + "    vary: 5\n", "vary"),
    "max_full not a number": (CPU + "    vary: [graphs]\n    max_full: lots\n", "max_full"),
    "neutral a number": (CPU + "    vary: [graphs]\n    neutral: 3\n", "neutral"),
    "orthogonality a list": (CPU + "    vary: [graphs]\northogonality: [1]\n", "orthogonality"),
    "min_share text": (CPU + "    vary: [graphs]\northogonality: {min_share: small}\n", "min_share"),
    # a percentage where a fraction is meant: every one-sided op would fall below it, listed and never judged
    "min_share a percentage": (CPU + "    vary: [graphs]\northogonality: {min_share: 2}\n", "min_share"),
    "ignore a list": (CPU + "    vary: [graphs]\northogonality: {ignore: [a, b]}\n", "ignore"),
    "graphs values unquoted on/off": (CPU + "    vary: {graphs: [on, off]}\n", "vary.graphs"),
    "a misspelled key": (CPU + "    vary: [graphs]\n    nuetral: [graphs]\n", "nuetral"),
}


@pytest.mark.parametrize("text,key", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_matrix_file_is_one_line_naming_the_key(tmp_path, text, key):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError) as info:
        load_matrix(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert key in message, f"the message does not name {key}: {message}"


@pytest.mark.parametrize("data, said", [
    (b"platforms:\n  \xc8\x00junk", "not UTF-8 text (byte 0xc8 at offset 13); fix the file"),
    (b"platforms: {}\nplatforms: {}\n", "key 'platforms' appears twice (first on line 1)"),
], ids=["binary-junk", "repeated-key"])
def test_a_matrix_file_of_junk_or_a_repeated_key_is_one_line(tmp_path, data, said):
    """Read through yaml.safe_load of its own: junk was a UnicodeDecodeError traceback at collection, and a second
    `platforms:` replaced the first in silence."""
    path = tmp_path / "matrix.yaml"
    path.write_bytes(data)
    with pytest.raises(SuiteError) as info:
        load_matrix(path)
    assert "\n" not in str(info.value) and said in str(info.value), str(info.value)


@pytest.mark.parametrize("text", [CPU + "    vary: {graphs: on}\n", CPU + "    vary: {graphs: [on, off]}\n"])
def test_unquoted_on_off_says_to_quote_them(tmp_path, text):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError, match='quote the value \\("on", "off"\\)'):
        load_matrix(path)


def test_the_repository_matrix_file_loads():
    data = load_matrix(MATRIX_FILE)
    assert data.platforms and all(m.vary for m in data.platforms)
