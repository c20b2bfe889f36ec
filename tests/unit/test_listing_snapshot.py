"""`pytest --list-configs` as a syrupy snapshot: what every config sets and must show, per flavour.

The listing is a readable digest of configs/*.yaml (flags, env vars, kernel patterns, verified or not).
A change to the data shows up here as a snapshot diff to review; accept it with
`pytest tests/unit/test_listing_snapshot.py --snapshot-update`.
"""
from pathlib import Path

from harness.configs import Catalog
from harness.errors import SuiteError
from harness.listing import list_configs
from harness.platform import Platform
from harness.suite import Suite


def test_list_configs_output_is_reviewed(snapshot):
    catalog = Catalog()
    platform = Platform("cpu", "any CPU", None)  # the machine running the tests must not change the text
    suite = Suite(catalog, platform, catalog.flavour("cpu"), SuiteError("no model needed"), Path("/nonexistent"), None)
    assert list_configs(suite) == snapshot
