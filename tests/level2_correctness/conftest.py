"""Level 2 plumbing: the workload, its tolerance on this platform, and the config's golden."""
from functools import partial

import pytest

from harness.correctness.level2 import check_golden_data, load_workload


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
