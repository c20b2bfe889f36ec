"""Fixtures shared by the harness's unit tests."""
import pytest

from harness.core.platform import detect_platform


@pytest.fixture
def on_cpu(monkeypatch):
    """A test of what a CPU machine sees (cpu-bf16 runs, the GPU configs do not). scripts/test.sh runs the unit tests on
    GPU machines too, where the detected platform would be the GPU's."""
    monkeypatch.setenv("SUITE_PLATFORM", "cpu")
    detect_platform.cache_clear()
    yield
    detect_platform.cache_clear()
