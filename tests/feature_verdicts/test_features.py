"""Feature verdicts (the users' porting protocol): each feature's candidate judged against the baseline configuration
in one run; the review file docs/porting/FEATURE_<name>.md is regenerated from it.

    pytest -m feature --feature=cutlass-gemm          # one feature of configs/features.yaml (P1 of the plan)
    pytest -m feature --feature=all                   # every feature of this run's flavour, in dependency order
    pytest -m feature --config=gemm-mxfp8 --against=marlin-bf16 --criteria='tg32 >= +5%; used_memory <= +1 GB'
"""

import warnings

import pytest

from harness.features.judge import Status

pytestmark = [pytest.mark.feature, pytest.mark.server]


def test_required_levels_pass_on_the_candidate(feature_result):
    r = feature_result
    if r.status is Status.BLOCKED:
        pytest.fail(f"{r.feature.name} is blocked by {r.blocked_by}: its gate must pass first", pytrace=False)
    bad = {lv: o for lv, o in r.levels.items() if o.status == "FAIL" or (o.status != "PASS" and r.strict)}
    for lv, o in r.levels.items():
        if o.status == "NOT RUN":
            warnings.warn(f"{r.feature.name}: {lv} ran no test on {r.feature.candidate} ({o.skip_reason})")
    assert not bad, (f"{r.feature.candidate}: required levels did not pass: "
                     + "; ".join(f"{lv} {o.status} ({o.failed} failed: {' | '.join(o.first_failures)})"
                                 for lv, o in bad.items()) + f"; logs: {r.artifacts}/levels")


def test_success_criteria_against_the_baseline_config(feature_result):
    r = feature_result
    assert r.criteria, f"{r.feature.name}: no criterion was judged; a feature judged on nothing is not a pass"
    lines = [f"{v.status.value:12s} {v.criterion}: {v.why}" for v in r.criteria]
    print(f"\n[{r.feature.name}: {r.feature.candidate} vs {r.feature.baseline}, {r.order}]\n  " + "\n  ".join(lines))
    failed = [v for v in r.criteria if v.status in (Status.FAIL, Status.ERROR, Status.BLOCKED)]
    unclear = [v for v in r.criteria if v.status is Status.INCONCLUSIVE]
    if unclear and not r.strict:
        warnings.warn(f"{r.feature.name}: inconclusive: " + "; ".join(f"{v.criterion} ({v.why})" for v in unclear))
    assert not failed and not (unclear and r.strict), (
        f"{r.feature.name} ({r.feature.candidate} vs {r.feature.baseline}) does not meet its criteria:\n  "
        + "\n  ".join(f"{v.status.value} {v.criterion}: {v.why}" for v in failed + (unclear if r.strict else [])))
