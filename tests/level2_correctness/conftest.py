"""Level 2 plumbing: the workload, its tolerance on this platform, and the config's golden."""
from functools import partial

import pytest

from harness.correctness.level2 import check_golden_data, judge, load_workload, run_level2


@pytest.fixture(scope="session")
def workload():
    return load_workload()


@pytest.fixture(scope="session")
def tolerance(workload, suite):
    return workload.tolerance(suite.platform.name)


@pytest.fixture(scope="session")
def level2_golden(goldens, workload, suite):
    """The stored level 2 golden (validated: one stream and one scoring per workload prompt), or None under
    --force-regen (the run scores its own sequences)."""
    if not suite.model.has_real_weights:  # before the golden is looked for: shape models have none, by design
        pytest.skip(f"{suite.model.alias} has dummy weights: outputs are meaningless, so there is nothing to check")
    return goldens.load("level2", "level2", partial(check_golden_data, prompts=workload.prompts))


@pytest.fixture(scope="session")
def level2(server, suite, workload, level2_golden):
    """This config's level 2 run: its streams, teacher-forced scorings and perplexity, scored on the golden's
    sequences (under --force-regen, on its own)."""
    if not suite.model.has_real_weights:
        pytest.skip(f"{suite.model.alias} has dummy weights: outputs are meaningless, so there is nothing to check")
    return run_level2(server.client(), workload, level2_golden)


@pytest.fixture(scope="session")
def unmutated_problem(level2, level2_golden, tolerance) -> str | None:
    """The first rule this config's own, unmutated level 2 breaks against the golden (None: it passes, or
    --force-regen is recording one). A mutation judged against a golden the unmutated config already fails
    proves nothing either way: on an H100 (2026-12-06) gemv-bf16-mxfp4-all, which serves its dense layers in MXFP4,
    judged against triton-bf16's goldens (--goldens-of) differed by up to 1.2 nats, so every mutated copy "failed
    level 2" without level 2 seeing the mutation, and the decode-only fault's premise check blamed the fault."""
    if level2_golden is None:
        return None
    verdict = judge(level2, level2_golden, tolerance)
    return None if verdict.ok else verdict.problems[0].splitlines()[0]
