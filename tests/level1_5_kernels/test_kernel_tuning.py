"""kernels/tuning.yaml's GB10 sections stay marked unverified until a run on that hardware validates them.

The sm_12x / sm_121 entries are reasoned from H200 counters, not measured on a GB10 (tuning.yaml says why per
key). Each carries `verified`; true must name the run (`evidence`, a file in docs/evidence/), so the marking cannot
be flipped without one. The keys are data about the section, not launch parameters: get_config must not see them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kernels import tuning

pytestmark = pytest.mark.level1_5

REPO = Path(__file__).resolve().parents[2]
GB10_SECTIONS = ("sm_12x", "sm_121")


@pytest.mark.parametrize("section", GB10_SECTIONS)
def test_gb10_sections_say_whether_a_gb10_run_verified_them(section):
    data = tuning._load(str(tuning.DEFAULT_FILE))[section]
    assert isinstance(data.get("verified"), bool), f"tuning.yaml {section}: add `verified: false` until a GB10 run"
    if data["verified"]:
        evidence = REPO / "docs" / "evidence" / str(data.get("evidence", ""))
        assert data.get("evidence") and evidence.is_file(), f"tuning.yaml {section}: verified by which run? {evidence}"
    assert tuning.verified("sm_121") is tuning._load(str(tuning.DEFAULT_FILE))["sm_121"]["verified"]


def test_verified_falls_back_to_the_family_and_is_not_a_launch_parameter():
    assert tuning.verified("sm_120") is tuning._load(str(tuning.DEFAULT_FILE))["sm_12x"]["verified"]
    assert tuning.verified("sm_80") is None  # no section: the file claims nothing
    for kernel in ("gemv", "moe", "quant"):
        cfg = tuning.get_config(kernel, "sm_121")
        assert "verified" not in cfg and "evidence" not in cfg, cfg


def test_an_environment_override_is_seen_when_set_changed_and_removed(monkeypatch):
    """The lookup filters os.environ's raw store for speed (the lm_head runs it every decode step); it must still
    see every change of a KERNELS_* variable at the next call."""
    from kernels.tuning import get_config

    base = get_config("packed_mm", "sm_90")["block_m"]
    monkeypatch.setenv("KERNELS_PACKED_MM_BLOCK_M", "32")
    assert get_config("packed_mm", "sm_90")["block_m"] == 32
    monkeypatch.setenv("KERNELS_PACKED_MM_BLOCK_M", "128")
    assert get_config("packed_mm", "sm_90")["block_m"] == 128
    monkeypatch.delenv("KERNELS_PACKED_MM_BLOCK_M")
    assert get_config("packed_mm", "sm_90")["block_m"] == base


def test_a_caller_changing_its_config_does_not_change_the_next_one():
    from kernels.tuning import get_config

    cfg = get_config("gemv", "sm_90")
    cfg["packed"]["impl"] = "changed"
    cfg["block_n"] = "changed"
    again = get_config("gemv", "sm_90")
    assert again["packed"].get("impl") != "changed" and again["block_n"] != "changed"
