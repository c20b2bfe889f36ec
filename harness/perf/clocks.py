"""GPU clocks and power per measured round (NVML), so a number can be read next to the clock it ran at.

Why: an H200 idles at 345 MHz between requests and runs at 1980 MHz under load; a prefill that starts
before the clock has ramped is slower for reasons that have nothing to do with the code under test
(measured: pp2048 -47% and TTFT +79% on an A/A boot). The benchmark warms up right before each round,
samples the SM and memory clocks, power and NVML's clock-event reasons while the round runs, and flags
a round whose SM clock fell below `floor x` the loaded clock (the GPU's maximum SM clock) at any sample.

On machines without NVML (CPU) every round reads as "no clocks" and nothing is flagged.
"""
from __future__ import annotations

import os
import statistics
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from harness.core.nvml import error_name
from harness.core.nvml import load as load_nvml

NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2  # nvmlClockType_t: GRAPHICS=0, SM=1, MEM=2


@dataclass
class RoundClocks:
    """What the GPU ran at while one round was measured (None everywhere without NVML)."""

    sm_mhz: float | None = None  # median of the samples
    sm_min_mhz: float | None = None
    mem_mhz: float | None = None
    power_w: float | None = None  # median
    power_max_w: float | None = None
    reasons: str | None = None  # OR of nvmlDeviceGetCurrentClocksEventReasons over the round, hex
    n: int = 0  # samples
    flagged: bool = False
    why: str | None = None

    def record(self) -> dict[str, Any]:
        """Compact form for results files (None fields dropped)."""
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(self).items()
                if v is not None and not (k == "flagged" and v is False)}


def _gpu_index() -> int:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


@dataclass
class ClockSampler:
    """NVML sampler of one GPU. `with sampler.round() as rc:` fills `rc` when the block ends."""

    interval_s: float = 0.01
    floor: float | None = 0.90  # flag a round below floor x loaded clock (None: never flag)
    nvml: Any = None
    index: int = field(default_factory=_gpu_index)
    available: bool = False
    reason: str = ""
    loaded_sm_mhz: float | None = None
    loaded_source: str | None = None
    power_limit_w: float | None = None
    _handle: Any = None

    def __post_init__(self) -> None:
        nvml = self.nvml if self.nvml is not None else load_nvml()
        if nvml is None:
            self.reason = "pynvml not installed: no clock readings"
            return
        try:
            nvml.nvmlInit()
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as e:
            self.reason = f"NVML unavailable ({error_name(e)}): no clock readings"
            return
        self.nvml, self.available = nvml, True
        try:
            self.loaded_sm_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(self._handle, NVML_CLOCK_SM))
            self.loaded_source = "NVML max SM clock (what the GPU runs at under load when nothing throttles it)"
        except Exception as e:
            self.loaded_source = f"unknown: nvmlDeviceGetMaxClockInfo {error_name(e)}; rounds are not flagged"
        try:
            self.power_limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000.0
        except Exception:
            pass

    def close(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False

    def describe(self) -> dict[str, Any]:
        return {"available": self.available, "reason": self.reason or None, "gpu_index": self.index,
                "loaded_sm_mhz": self.loaded_sm_mhz, "loaded_source": self.loaded_source, "floor": self.floor,
                "flag_below_mhz": self.threshold_mhz, "power_limit_w": self.power_limit_w,
                "interval_ms": round(self.interval_s * 1000, 1)}

    @property
    def threshold_mhz(self) -> float | None:
        if self.loaded_sm_mhz is None or self.floor is None:
            return None
        return round(self.loaded_sm_mhz * self.floor, 1)

    def _read(self) -> tuple[float | None, float | None, float | None, int]:
        n, h = self.nvml, self._handle
        out: list[Any] = []
        for fn in (lambda: n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM), lambda: n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM),
                   lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0):
            try:
                out.append(float(fn()))
            except Exception:
                out.append(None)
        reasons = 0
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            f = getattr(n, name, None)
            if f is not None:
                try:
                    reasons = int(f(h))
                    break
                except Exception:
                    continue
        return out[0], out[1], out[2], reasons

    @contextmanager
    def round(self) -> Iterator[RoundClocks]:
        rc = RoundClocks()
        if not self.available:
            yield rc
            return
        samples: list[tuple] = []
        stop = threading.Event()

        def run() -> None:
            while True:
                samples.append(self._read())
                if stop.wait(self.interval_s):
                    break

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            yield rc
        finally:
            stop.set()
            t.join(timeout=5)
            samples.append(self._read())
            self._fill(rc, samples)

    def _fill(self, rc: RoundClocks, samples: list[tuple]) -> None:
        sm = [s[0] for s in samples if s[0] is not None]
        mem = [s[1] for s in samples if s[1] is not None]
        pw = [s[2] for s in samples if s[2] is not None]
        reasons = 0
        for s in samples:
            reasons |= s[3]
        rc.n = len(samples)
        rc.sm_mhz = statistics.median(sm) if sm else None
        rc.sm_min_mhz = min(sm) if sm else None
        rc.mem_mhz = statistics.median(mem) if mem else None
        rc.power_w = statistics.median(pw) if pw else None
        rc.power_max_w = max(pw) if pw else None
        rc.reasons = hex(reasons)
        limit = self.threshold_mhz
        if limit is not None and rc.sm_min_mhz is not None and rc.sm_min_mhz < limit:
            rc.flagged = True
            rc.why = (f"SM clock fell to {rc.sm_min_mhz:.0f} MHz during the round (< {limit:.0f} = {self.floor:g} x "
                      f"loaded {self.loaded_sm_mhz:.0f} MHz; clock-event reasons {rc.reasons})")

