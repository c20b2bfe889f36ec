"""Model aliases: the embedded tiny gpt-oss (BF16 for CPU, MXFP4 experts for GPUs) and shape-only
gpt-oss-120b / gpt-oss-20b (real config.json dimensions, no weights: `--load-format dummy`)."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import SuiteError

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"


@dataclass(frozen=True)
class Model:
    alias: str  # short name used in file keys (goldens, baselines)
    path: str  # what vLLM's --model gets
    args: dict[str, Any] = field(default_factory=dict)  # extra server flags this model needs
    weights: str = "real"  # "real" or "dummy" (shape-only: outputs are meaningless)

    @property
    def has_real_weights(self) -> bool:
        return self.weights == "real"


ALIASES: dict[str, dict[str, Any]] = {
    "tiny-gpt-oss": {"dir": "tiny-gpt-oss", "args": {"--max-model-len": 4096}},
    "tiny-gpt-oss-mxfp4": {"dir": "tiny-gpt-oss-mxfp4", "args": {"--max-model-len": 4096}},
    # 61.4 GiB of dummy weights: fits an H100 80GB only above the seed's 0.70 memory fraction
    "gpt-oss-120b-shape": {
        "shape": "gpt-oss-120b",
        "args": {"--load-format": "dummy", "--max-model-len": 16384, "--gpu-memory-utilization": 0.92},
    },
    "gpt-oss-20b-shape": {
        "shape": "gpt-oss-20b",
        "args": {"--load-format": "dummy", "--max-model-len": 16384},
    },
}


def default_alias(platform_name: str) -> str:
    # The CPU MXFP4 MoE path needs AMX, so CPUs get the BF16 twin of the same weights.
    return "tiny-gpt-oss" if platform_name == "cpu" else "tiny-gpt-oss-mxfp4"


def resolve_model(name: str, work_dir: Path) -> Model:
    """An alias, a local checkpoint directory, or a hub id (`org/name`, resolved by vLLM itself)."""
    if name in ALIASES:
        spec = ALIASES[name]
        if "dir" in spec:
            path = MODELS / spec["dir"]
            if not (path / "config.json").is_file():
                raise SuiteError(f"model alias '{name}': {path}/config.json is missing; restore models/ from git")
            return Model(name, str(path), dict(spec["args"]))
        return Model(name, str(_materialize_shape(spec["shape"], work_dir)), dict(spec["args"]), "dummy")
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise SuiteError(f"--model {name}: no config.json in that directory; pass a checkpoint directory or one of: {', '.join(ALIASES)}")
        return Model(_slug(path.name), str(path.resolve()))
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return Model(_slug(name), name)  # a hub id such as openai/gpt-oss-120b (the users' GB10 has it cached)
    raise SuiteError(f"--model {name}: no such directory; pass a checkpoint directory, a hub id, or one of: {', '.join(ALIASES)}")


def _materialize_shape(shape: str, work_dir: Path) -> Path:
    """config.json of the real model + the embedded model's tokenizer, in a run directory.

    Why a copy: vLLM wants one directory; the tokenizer only needs to cover the token ids the suite
    sends (all below the tiny vocabulary), so the real 201k-entry tokenizer is not needed.
    """
    src_config = MODELS / "shapes" / shape / "config.json"
    tokenizer_dir = MODELS / "tiny-gpt-oss"
    if not src_config.is_file():
        raise SuiteError(f"shape '{shape}': {src_config} is missing; restore models/shapes from git")
    out = work_dir / "models" / f"{shape}-shape"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src_config, out / "config.json")
    for f in tokenizer_dir.glob("*"):
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    gen = {"bos_token_id": None, "eos_token_id": json.loads(src_config.read_text()).get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-").lower()
