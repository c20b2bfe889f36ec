"""Where the repository's data lives (one definition; every module takes its paths from here)."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from harness.core.errors import SuiteError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
GOLDEN_ROOT = REPO / "goldens"
BASELINE_ROOT = REPO / "baselines"
MODELS_DIR = REPO / "models"
TESTS_DIR = REPO / "tests"
PLUGIN_SITE = REPO / "plugins" / "site"


def shown(path: Path) -> Path:
    """`path` relative to the repository when inside it (for messages), else as given."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def slug(text: str) -> str:
    """A name safe as one path part: lower-case, trademark-free, dash-separated
    ('Intel(R) Xeon(R) Gold 6430' -> 'intel-xeon-gold-6430', 'openai/gpt-oss-120b' -> 'openai-gpt-oss-120b')."""
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    text = re.sub(r"[^a-z0-9._]+", "-", text).strip("-.")
    return text or "unknown"


def writable_dir(path: Path, option: str) -> Path:
    """`path` created and written to once (a unique file: parallel workers share the folder), resolved; one line
    naming `option` when that fails."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        # a file there said "cannot write there (File exists)", as if the folder were full or locked
        why = "a file, not a directory" if path.is_file() else e.strerror
        raise SuiteError(f"{option} {path}: cannot write there ({why}); pass a writable directory") from None
    return path.resolve()
