"""`pytest --list-configs` as a syrupy snapshot: what every config sets and must show, per flavour.

The listing is a readable digest of configs/*.yaml (flags, env vars, kernel patterns, verified or not).
A change to the data shows up here as a snapshot diff to review; accept it with
`pytest tests/unit/test_listing_snapshot.py --snapshot-update`.
"""
import os
import subprocess
import sys
from pathlib import Path

from harness.config.catalog import Catalog
from harness.core.errors import SuiteError
from harness.core.platform import Platform
from harness.report.listing import list_configs
from harness.session.suite import Suite


def test_list_configs_output_is_reviewed(snapshot):
    catalog = Catalog()
    platform = Platform("cpu", "any CPU", None)  # the machine running the tests must not change the text
    suite = Suite(catalog, platform, catalog.flavour("cpu"), SuiteError("no model needed"), Path("/nonexistent"), None)
    assert list_configs(suite) == snapshot


def test_the_listing_says_what_the_model_itself_sets():
    """A shape alias boots with vLLM's dummy load and the valid-weights hook whatever the config: the listing says so."""
    from harness.engine.models import ALIASES, SHAPE_ENV, Model

    catalog = Catalog()  # the alias's own args and env, without writing its checkpoint files
    model = Model("gpt-oss-120b-shape", "/nonexistent", dict(ALIASES["gpt-oss-120b-shape"]["args"]), "dummy",
                  env=dict(SHAPE_ENV))
    suite = Suite(catalog, Platform("sm_90", "H100", (9, 0)), catalog.flavour("upstream"), model, Path("/nonexistent"), None)
    head = list_configs(suite).splitlines()[0]
    assert "model: gpt-oss-120b-shape (sets SUITE_HOOK_RANDOM_MXFP4=1 --load-format dummy" in head, head


def test_a_level_run_that_deselects_this_test_does_not_exit_red():
    """A green level run must exit 0: the unused-snapshot report must not turn it red."""
    repo = Path(__file__).resolve().parents[2]
    # not as an xdist worker: syrupy skips its unused-snapshot check there, which would hide the fault
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--co", "-m", "level1_5",
                        "-k", "not mutated"], cwd=repo, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout[-600:]}{r.stderr[-300:]}"
    assert "collected" in r.stdout
