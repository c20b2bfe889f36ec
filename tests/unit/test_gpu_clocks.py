"""harness.perf.clocks without a GPU (mutation audit): which GPU the sampler reads, what a round's summary keeps
(the peak power, every clock-event reason seen), where the flag threshold lies, and `floor=None` (never flag)."""
import pytest

from harness.perf import clocks


class FakeNVML:
    """pynvml's surface as ClockSampler uses it; records the GPU index it was asked for."""

    def __init__(self, max_sm=1980):
        self.max_sm, self.asked = max_sm, []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        self.asked.append(i)
        return f"h{i}"

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return self.max_sm

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000


def sampler(**kw):
    return clocks.ClockSampler(interval_s=0.001, nvml=FakeNVML(), **kw)


@pytest.mark.parametrize("env,want", [("3", 3), ("2,0", 2), ("GPU-5d3c1a", 0)])
def test_sampler_reads_the_first_visible_gpu(monkeypatch, env, want):
    """Guards against the sampler always reading GPU 0: an xdist worker pinned to GPU 3 would flag (or clear) its
    rounds by another worker's GPU clock."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    s = sampler()
    assert s.index == want and s.nvml.asked == [want], (env, s.index, s.nvml.asked)


def test_round_summary_keeps_every_reason_and_the_peak_power():
    """Guards against a round's clock-event reasons being only the last sample's (a throttle in mid-round would
    vanish from the results) and against power_max_w not being the maximum."""
    s = sampler()
    rc = clocks.RoundClocks()
    s._fill(rc, [(1980.0, 3201.0, 400.0, 0x1), (1980.0, 3201.0, 650.0, 0x4), (1980.0, 3201.0, 420.0, 0x0)])
    assert rc.reasons == hex(0x5), rc.reasons
    assert rc.power_max_w == 650.0 and rc.power_w == 420.0, rc
    assert rc.n == 3 and not rc.flagged


def test_a_round_exactly_at_the_threshold_is_not_flagged():
    """The flag is for a clock that fell *below* floor x loaded; a minimum sample equal to the threshold is clean
    (guards against `<` becoming `<=`)."""
    s = sampler(floor=0.9)
    limit = s.threshold_mhz
    assert limit == 1782.0
    rc = clocks.RoundClocks()
    s._fill(rc, [(1980.0, 3201.0, 400.0, 0), (limit, 3201.0, 400.0, 0)])
    assert not rc.flagged and rc.why is None, rc
    rc = clocks.RoundClocks()
    s._fill(rc, [(1980.0, 3201.0, 400.0, 0), (limit - 0.5, 3201.0, 400.0, 0)])
    assert rc.flagged, rc


def test_floor_none_never_flags():
    """Guards against threshold_mhz multiplying by a None floor: `floor=None` means "never flag" and must neither
    raise nor flag a round at the idle clock."""
    s = sampler(floor=None)
    assert s.threshold_mhz is None and s.describe()["flag_below_mhz"] is None
    rc = clocks.RoundClocks()
    s._fill(rc, [(345.0, 3201.0, 100.0, 0)])
    assert not rc.flagged and rc.sm_min_mhz == 345.0, rc


def test_record_keeps_one_decimal():
    """Results files keep clocks and power to 0.1 (guards against rounding them to integers)."""
    rc = clocks.RoundClocks(sm_mhz=1912.5, power_w=432.25, n=2)
    assert rc.record() == {"sm_mhz": 1912.5, "power_w": 432.2, "n": 2}, rc.record()
