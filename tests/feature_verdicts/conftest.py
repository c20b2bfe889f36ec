"""Feature verdicts' fixtures: which features this run judges (--feature, or --config with --against), their
results computed once each in dependency order (a required feature's gate decides whether a feature runs), and
the review files, verdict JSON and comparison matrix written from them."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.features.measure import MIN_ROUNDS
from harness.features.review import write_matrix, write_review, write_verdicts
from harness.features.run import FeatureResult, decode_breakdown, require_runnable, run_feature
from harness.features.spec import Feature, selected_features
from harness.perf import bench
from harness.session.suite import SUITE_KEY, Suite

RESULTS = pytest.StashKey[dict]()


def _features(config: pytest.Config) -> dict[str, Feature]:
    """The features this run judges, in file order; an ad-hoc one for --config X --against Y. With a feature option
    the root conftest checked them before collection; a broken configs/features.yaml met here fails each feature
    test with its one line instead of stopping collection with pluggy's stack."""
    suite: Suite = config.stash[SUITE_KEY]
    return selected_features(suite.catalog, suite.platform.name, suite.flavour.name, config.getoption("--feature"),
                             config.getoption("--against"), config.getoption("--config"), config.getoption("--criteria"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "feature" in metafunc.fixturenames:
        try:
            names = list(_features(metafunc.config))
        except SuiteError as e:
            metafunc.parametrize("feature", [e], ids=["features-file"], scope="session")
            return
        metafunc.parametrize("feature", names, ids=names, scope="session")


@pytest.fixture(scope="session")
def judged(request: pytest.FixtureRequest, suite: Suite) -> dict[str, FeatureResult]:
    """Results of this session, by feature name (filled as features are judged)."""
    return request.config.stash.setdefault(RESULTS, {})


def _rounds(config: pytest.Config, suite: Suite) -> int:
    rounds = config.getoption("--feature-rounds")
    if rounds:
        return rounds
    workloads, _ = bench.load_workloads(suite.platform.name, 10 ** 9)
    return max(MIN_ROUNDS, workloads[0].runs)


def _boot(suite: Suite):
    together = suite.can_boot_secondary()[0]

    def boot(config: str, tag: str, env: dict | None = None, beside: bool = False):
        # both sides alike: on a GPU the pair shares the card at the secondary memory fraction, so KV capacities
        # compare like for like
        target = suite.target(suite.catalog.parse(config))
        return suite.boot(target, tag=tag, env_extra=env, beside_shared=together and suite.platform.is_cuda)

    return boot


def judge(request: pytest.FixtureRequest, suite: Suite, judged: dict, name: str) -> FeatureResult:
    if name in judged:
        return judged[name]
    features = _features(request.config)
    f = features[name]
    why = require_runnable(suite, f)
    if why:
        pytest.skip(why)
    for r in f.requires:  # a required feature selected in this run is judged first; its gate decides
        if r in features and r not in judged:
            try:
                judge(request, suite, judged, r)
            except pytest.skip.Exception:
                pass
    gates = {n: res.gate_status for n, res in judged.items()}
    cfg = request.config
    strict = bool(cfg.getoption("--strict-verdicts")) or suite.platform.name.startswith("sm_12")  # the nightly GB10
    level_args = [f"--server-arg={a}" for a in suite.server_args]  # the candidate's levels boot it like this run does
    notes: list[str] = []
    result = run_feature(suite, f, _rounds(cfg, suite), strict, gates, _boot(suite), level_args,
                         cfg.getoption("--level-timeout"), profile=lambda running: decode_breakdown(suite, running, notes))
    result.notes += notes
    judged[name] = result
    ad_hoc_run = bool(cfg.getoption("--against"))
    review_dir = Path(cfg.getoption("--review-dir") or (suite.run_dir / "features" if ad_hoc_run else REPO / "docs" / "porting"))
    result.notes.append(f"review: {write_review(result, review_dir)}")
    write_verdicts(list(judged.values()), suite.run_dir / "features" / "verdicts.json")
    write_matrix(list(judged.values()), suite.run_dir / "features" / "matrix.md")
    return result


@pytest.fixture(scope="session")
def feature_result(request: pytest.FixtureRequest, suite: Suite, judged, feature: str | SuiteError) -> FeatureResult:
    if isinstance(feature, SuiteError):
        pytest.fail(str(feature), pytrace=False)
    return judge(request, suite, judged, feature)
