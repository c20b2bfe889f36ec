"""NVML, where there is one: loading pynvml without failing on machines that lack it, and its errors by name."""
from __future__ import annotations

from types import ModuleType

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
_ERRORS = {1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
           6: "NOT_FOUND", 9: "DRIVER_NOT_LOADED", 12: "LIBRARY_NOT_FOUND", 13: "FUNCTION_NOT_FOUND",
           15: "GPU_IS_LOST", 999: "UNKNOWN"}
NOT_AVAILABLE = 2 ** 64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long fields


def error_name(e: BaseException) -> str:
    """'NOT_SUPPORTED' for pynvml's NVMLError_NotSupported (value 3), else the error's text."""
    value = getattr(e, "value", None)
    if value in _ERRORS:
        return _ERRORS[value]
    text = str(e) or type(e).__name__
    return "NOT_SUPPORTED" if "not supported" in text.lower() else text


def load() -> ModuleType | None:
    """pynvml, or None where it is not installed (CPU machines)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml
