"""Which platform this run is on: `cpu`, or a CUDA compute capability such as `sm_90` / `sm_121`.

Every result the suite writes carries this name, so a reader always knows where a number came from.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable


# the platform of a --server-url server when --platform does not say it
UNKNOWN_PLATFORM = "unknown"


@dataclass(frozen=True)
class Platform:
    name: str  # "cpu", "sm_90", "sm_121", ...
    device: str  # human-readable device name
    capability: tuple[int, int] | None  # CUDA compute capability, None on CPU

    @property
    def is_cuda(self) -> bool:
        return self.capability is not None


FORCE_PLATFORM = "SUITE_PLATFORM"  # `cpu`: run as a CPU machine on a GPU one (its goldens, model and configs)


def _forced() -> str:
    return os.environ.get(FORCE_PLATFORM, "").strip().lower()


def forced_platform_problem() -> str | None:
    """Why SUITE_PLATFORM's value means nothing (None: unset or `cpu`): another value was ignored in silence, so
    `SUITE_PLATFORM=sm_121` on an H100 ran as the H100."""
    if _forced() in ("", "cpu"):
        return None
    return (f"{FORCE_PLATFORM}={os.environ[FORCE_PLATFORM]!r}: only `cpu` is known (it runs a GPU machine as a CPU "
            "one); unset it, and judge a server of another platform with --server-url and --platform")


def forces_cpu() -> bool:
    return _forced() == "cpu"


@lru_cache(maxsize=1)
def detect_platform() -> Platform:
    """Detect the accelerator torch sees; `SUITE_PLATFORM=cpu` forces the CPU platform."""
    if forces_cpu():
        return _cpu_platform()
    try:
        import torch
    except ImportError:
        return _cpu_platform()
    if not torch.cuda.is_available():
        return _cpu_platform()
    major, minor = torch.cuda.get_device_capability(0)
    return Platform(f"sm_{major}{minor}", torch.cuda.get_device_name(0), (major, minor))


def _cpu_platform() -> Platform:
    return Platform("cpu", cpu_model_name(), None)


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform as _p

    return _p.processor() or "unknown cpu"


_SM = re.compile(r"^sm_(\d+)$")


def _sm_number(name: str) -> int | None:
    m = _SM.match(name)
    return int(m.group(1)) if m else None


def platform_matches(selector: str, platform_name: str) -> bool:
    """Does a platform selector match a platform name?

    Selectors: `cpu`; an exact `sm_90`; a family `sm_12x` (any digit for `x`, so sm_120 and sm_121);
    a lower bound `>=sm_80`.
    """
    selector = selector.strip()
    if selector.startswith(">="):
        want, have = _sm_number(selector[2:].strip()), _sm_number(platform_name)
        return want is not None and have is not None and have >= want
    if "x" in selector:
        return re.fullmatch(selector.replace("x", r"\d"), platform_name) is not None
    return selector == platform_name


def selector_breadth(selector: str) -> int:
    """0 for one platform (`cpu`, `sm_121`), 1 for a family (`sm_12x`), 2 for a lower bound (`>=sm_80`)."""
    s = selector.strip()
    return 2 if s.startswith(">=") else 1 if "x" in s else 0


def best_selector(selectors: Iterable[str], platform_name: str) -> str | None:
    """The selector whose entry a platform takes where several match: the most specific (one platform, then a
    family, then a lower bound), whatever the file's order, so a catch-all written first never shadows GB10's own
    entry; equally specific ones in file order. None where none matches."""
    matching = [s for s in selectors if platform_matches(s, platform_name)]
    return min(matching, key=selector_breadth) if matching else None


def broadest_first(selectors: Iterable[str], platform_name: str) -> list[str]:
    """Every selector that matches the platform in the order layered overrides apply, so the last one applied is
    `best_selector`'s: the broadest first and, among equally specific ones, the file's first one last."""
    matching = [s for s in selectors if platform_matches(s, platform_name)]
    order = sorted(range(len(matching)), key=lambda i: (selector_breadth(matching[i]), i), reverse=True)
    return [matching[i] for i in order]


def is_valid_selector(selector: str) -> bool:
    s = selector.strip()
    if s == "cpu":
        return True
    if s.startswith(">="):
        return _sm_number(s[2:].strip()) is not None
    return re.fullmatch(r"sm_[0-9x]+", s) is not None
