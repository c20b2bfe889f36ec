"""scripts/crosscheck_llama_benchy.py without a server: the offline corpus seed and the ±2% / explained rule."""
import hashlib
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crosscheck_llama_benchy.py"
spec = importlib.util.spec_from_file_location("crosscheck", SCRIPT)
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def test_corpus_is_seeded_where_llama_benchy_reads_it_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    url, cache = cc.seed_corpus()
    assert cache == tmp_path / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"
    assert len(cache.read_text()) > 20_000 and url.startswith("https://suite.invalid/")


def benchy(pp, tg):
    return {"benchmarks": [{"pp_throughput": {"mean": pp}, "tg_throughput": {"mean": tg}}]}


def test_agree_explained_or_disagree():
    ours = {"pp2048": {"engine": [30000.0] * 5, "client": [27000.0] * 5},
            "tg32": {"engine": [230.0] * 5, "client": [229.0] * 5}}
    rows = {r["metric"]: r for r in cc.compare(benchy(27300.0, 231.0), ours, 2048, 32)}
    assert rows["tg32"]["verdict"] == "agree"
    assert rows["pp2048"]["verdict"] == "explained" and "engine vs client clock" in rows["pp2048"]["why"]
    assert rows["pp2048"]["diff_vs_engine"] == pytest.approx(-0.09)
    rows = {r["metric"]: r for r in cc.compare(benchy(20000.0, 200.0), ours, 2048, 32)}
    assert rows["pp2048"]["verdict"] == rows["tg32"]["verdict"] == "disagree"
