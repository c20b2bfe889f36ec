"""Model aliases: the embedded tiny gpt-oss (BF16 for CPU, MXFP4 experts for GPUs) and shape-only
gpt-oss-120b / gpt-oss-20b (real config.json dimensions, no weights: `--load-format dummy`).

The embedded model lives in the real gpt-oss token id space (o200k_harmony, vocab_size 201088):
vLLM renders gpt-oss chat prompts and parses generated ids with openai_harmony, whatever the
checkpoint's tokenizer says. A 201088-row embedding + lm_head would not fit the repository, so
models/tiny-gpt-oss* are *compact* (`compact.json` manifest: C rows + a row -> o200k id map, one
"other" row standing for every unused id) and are materialized here, once, into a full HF
checkpoint under the git-ignored `models/.materialized/<name>-<sha12 of the inputs>/`: every
unused id's embedding and lm_head row is the "other" row, the tokenizer comes from
models/tokenizer/build.py (o200k_harmony, from the committed o200k_base.tiktoken). Building is
atomic (temporary directory + rename, under a file lock), so concurrent pytest-xdist workers
are safe; a stamp records the sha256 of the inputs and the size/sha256 of every output file.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.core.errors import SuiteError
from harness.core.filelock import FileLock
from harness.core.paths import REPO, slug
from harness.engine.hooks import RANDOM_MXFP4_ENV

MODELS = REPO / "models"
MATERIALIZED = MODELS / ".materialized"  # git-ignored cache
TOKENIZER_DIR = MODELS / "tokenizer"  # o200k_base.tiktoken + build.py; TIKTOKEN_ENCODINGS_BASE points here
MANIFEST = "compact.json"
STAMP = ".materialized.json"
MATERIALIZE_VERSION = 1  # bump when the materialized output of the same inputs changes
VOCAB_ROW_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")
GENERATION_EOS = [200002, 199999, 200012]  # <|return|>, <|endoftext|>, <|call|> (never <|end|>)


@dataclass(frozen=True)
class Model:
    alias: str  # short name used in file keys (goldens, baselines)
    path: str  # what vLLM's --model gets
    args: dict[str, Any] = field(default_factory=dict)  # extra server flags this model needs
    weights: str = "real"  # "real" or "dummy" (shape-only: outputs are meaningless)
    # sha256 (12 hex) of what the weights were built from, for embedded models: goldens record it,
    # so a golden of an older embedded model is refused by name instead of failing as a "regression"
    fingerprint: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # server environment this model needs (before the config's)

    @property
    def has_real_weights(self) -> bool:
        return self.weights == "real"


# Shape models: vLLM's dummy loader fills floats with +-1e-3 and leaves the MXFP4 experts zero, and then the router's
# bias picks the same 4 experts for every token (H100: 4 experts carried 90% of the slots). The test hook gives them
# valid random weights instead (plugins/site/suite_testhooks/dummy_mxfp4.py: 78 of 128 experts for 90%). Their
# fingerprint names that init, so records measured on the collapsed routing are refused by name, not compared.
SHAPE_ENV = {RANDOM_MXFP4_ENV: "1"}
SHAPE_FINGERPRINT = "random-valid-1"  # bump when the hook's init changes what a shape model computes

ALIASES: dict[str, dict[str, Any]] = {
    "tiny-gpt-oss": {"compact": "tiny-gpt-oss", "args": {"--max-model-len": 4096}},
    "tiny-gpt-oss-mxfp4": {"compact": "tiny-gpt-oss-mxfp4", "args": {"--max-model-len": 4096}},
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


# what a truncated or hand-edited model file raises while it is read (JSON, safetensors header, shapes)
_UNREADABLE = (ValueError, KeyError, TypeError, IndexError, struct.error)


def resolve_model(name: str, work_dir: Path) -> Model:
    """An alias, a local checkpoint directory (a compact one is materialized), or a hub id
    (`org/name`, resolved by vLLM itself). `work_dir` is kept for callers; materialized
    checkpoints live in the shared cache models/.materialized/."""
    try:
        return _resolve_model(name)
    except _UNREADABLE as e:
        where = "restore the folder from git (git checkout -- models/)" if name in ALIASES else "fix or replace that checkpoint"
        raise SuiteError(f"model '{name}': a file of it cannot be read ({type(e).__name__}: {str(e)[:100]}); "
                         f"{where}") from None


def _resolve_model(name: str) -> Model:
    if name in ALIASES:
        spec = ALIASES[name]
        if "compact" in spec:
            src = MODELS / spec["compact"]
            if not (src / MANIFEST).is_file():
                raise SuiteError(f"model alias '{name}': {src}/{MANIFEST} is missing; restore models/ from git")
            built = materialize_compact(src, name=name)
            return Model(name, str(built), dict(spec["args"]), fingerprint=built.name.rsplit("-", 1)[-1])
        return Model(name, str(materialize_shape(spec["shape"])), dict(spec["args"]), "dummy", SHAPE_FINGERPRINT,
                     dict(SHAPE_ENV))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():  # was "no config.json in that directory" of a file
            raise SuiteError(f"--model {name}: a file, not a checkpoint directory; pass the folder that holds its "
                             f"config.json, or one of: {', '.join(ALIASES)}")
        if (path / "config.json").is_file():
            check_config_json(path / "config.json", name)
        if (path / MANIFEST).is_file():
            built = materialize_compact(path)
            return Model(slug(path.name), str(built), fingerprint=built.name.rsplit("-", 1)[-1])
        if not (path / "config.json").is_file():
            raise SuiteError(f"--model {name}: no config.json in that directory; pass a checkpoint directory or one of: {', '.join(ALIASES)}")
        if slug(path.name) in ALIASES:
            # goldens and baselines are keyed by this name, and a plain checkpoint has no fingerprint to tell it apart
            raise SuiteError(f"--model {name}: the folder is named like the suite's model alias {slug(path.name)}, whose "
                             f"goldens and baselines it would read and overwrite; rename the folder, or pass "
                             f"--model={slug(path.name)} for the suite's own")
        return Model(slug(path.name), str(path.resolve()))
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return Model(slug(name), name)  # a hub id such as openai/gpt-oss-120b (the users' GB10 has it cached)
    raise SuiteError(f"--model {name}: no such directory; pass a checkpoint directory, a hub id, or one of: {', '.join(ALIASES)}")


def check_config_json(path: Path, name: str) -> None:
    """A local checkpoint's config.json is one JSON object: vLLM reads it only once its server boots, where a corrupt
    one was a dead server (and its log) minutes into the run instead of one line now."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        problem = f"is not valid JSON ({e})"
    except OSError as e:
        problem = f"cannot be read ({e.strerror})"
    else:
        if isinstance(data, dict):
            return
        problem = f"holds a JSON {type(data).__name__}, not an object"
    raise SuiteError(f"--model {name}: {path} {problem}; fix or replace that checkpoint's config.json")


# ----------------------------------------------------------------------------- compact checkpoints
def read_manifest(src: Path) -> dict:
    """compact.json of a compact checkpoint folder, paths resolved:

    {"format": "compact-gpt-oss/1", "vocab_map": "compact_vocab.json",
     "weights": ["model.compact.safetensors", ...],   # merged in order; a later file's `X_blocks`
                                                       # replaces an earlier file's `X` (MXFP4 experts)
     "sha256": {"../tiny-gpt-oss/model.compact.safetensors": "..."}}   # optional: files of another
                                                       # folder this one was made from (checked)
    """
    m = json.loads((src / MANIFEST).read_text())
    if not isinstance(m, dict) or not isinstance(m.get("sha256", {}), dict):  # else an AttributeError, a traceback
        raise TypeError(f"{MANIFEST} is not a JSON object with a sha256 object: {str(m)[:60]}")
    if m.get("format") != "compact-gpt-oss/1":
        raise SuiteError(f"{src / MANIFEST}: unknown format {m.get('format')!r}")
    for rel, digest in m.get("sha256", {}).items():
        p = src / rel
        if not p.is_file() or file_sha256(p) != digest:
            raise SuiteError(f"{src.name}: {rel} is missing or is not the file this checkpoint was made from "
                             f"(sha256 {digest[:12]}); regenerate: .venv/bin/python models/training/convert_to_mxfp4.py")
    return {"vocab_map": (src / m["vocab_map"]).resolve(), "weights": [(src / w).resolve() for w in m["weights"]]}


def read_vocab_map(path: Path) -> dict:
    vm = json.loads(Path(path).read_text())
    ids = vm["ids"]
    if vm["rows"] != len(ids) + 1 or vm["other_row"] != len(ids):
        raise SuiteError(f"{path}: rows/other_row do not match the id list")
    if ids != sorted(set(ids)) or not ids or ids[0] < 0 or ids[-1] >= vm["vocab_size"]:
        raise SuiteError(f"{path}: ids must be ascending, unique and < vocab_size")
    return vm


def compact_inputs(src: Path) -> list[Path]:
    """Every file whose content the materialized checkpoint depends on."""
    man = read_manifest(src)
    return [src / "config.json", src / "generation_config.json", src / MANIFEST, man["vocab_map"], *man["weights"]]


def materialize_compact(src: Path, out: Path | None = None, name: str | None = None) -> Path:
    """The full HF checkpoint of the compact folder `src`: into `out` if given (overwritten, no
    cache), else into the cache models/.materialized/<name>-<sha12>/ (built once)."""
    src = Path(src).resolve()
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        _build_compact(src, out)
        return out
    name = slug(name or src.name)
    tok = tokenizer_cache()
    key = _inputs_sha256(compact_inputs(src), extra=f"compact v{MATERIALIZE_VERSION} {tok.name}")
    return _cached(name, key, lambda tmp: _build_compact(src, tmp, tok))


def materialize_shape(shape: str) -> Path:
    """config.json of the real model + the o200k_harmony tokenizer + a gpt-oss generation_config."""
    src_config = MODELS / "shapes" / shape / "config.json"
    if not src_config.is_file():
        raise SuiteError(f"shape '{shape}': {src_config} is missing; restore models/shapes from git")
    tok = tokenizer_cache()
    key = _inputs_sha256([src_config], extra=f"shape v{MATERIALIZE_VERSION} {tok.name}")

    def build(out: Path) -> None:
        shutil.copyfile(src_config, out / "config.json")
        cfg = json.loads(src_config.read_text())
        gen = {"bos_token_id": cfg.get("bos_token_id", 199998), "eos_token_id": GENERATION_EOS,
               "pad_token_id": cfg.get("pad_token_id", 199999)}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        _link_tokenizer(tok, out)

    return _cached(f"{shape}-shape", key, build)


def tokenizer_cache() -> Path:
    """models/.materialized/tokenizer-<sha12>/: tokenizer.json, tokenizer_config.json,
    special_tokens_map.json built by models/tokenizer/build.py from o200k_base.tiktoken."""
    build_py = TOKENIZER_DIR / "build.py"
    tiktoken = TOKENIZER_DIR / "o200k_base.tiktoken"
    for p in (build_py, tiktoken):
        if not p.is_file():
            raise SuiteError(f"{p} is missing; restore models/tokenizer from git")
    key = _inputs_sha256([build_py, tiktoken], extra="tokenizer")
    mod = _load_module(build_py, "_suite_tokenizer_build")
    return _cached("tokenizer", key, lambda out: mod.build_tokenizer(out, tiktoken))


def _build_compact(src: Path, out: Path, tok: Path | None = None) -> None:
    import numpy as np

    man = read_manifest(src)
    cfg = json.loads((src / "config.json").read_text())
    vm = read_vocab_map(man["vocab_map"])
    V = cfg["vocab_size"]
    if vm["vocab_size"] != V:
        raise SuiteError(f"{man['vocab_map']}: vocab_size {vm['vocab_size']} != config.json's {V}")
    row_of = np.full(V, vm["other_row"], dtype=np.int64)
    row_of[np.asarray(vm["ids"], dtype=np.int64)] = np.arange(len(vm["ids"]))

    tensors: dict[str, tuple[str, list[int], Any]] = {}
    for w in man["weights"]:
        for k, (dtype, shape, buf) in read_safetensors(w).items():
            tensors[k] = (dtype, shape, buf)
    for k in [k for k in tensors if k + "_blocks" in tensors]:
        del tensors[k]  # replaced by its MXFP4 blocks/scales
    for k in VOCAB_ROW_TENSORS:
        dtype, shape, buf = tensors[k]
        if shape[0] != vm["rows"]:
            raise SuiteError(f"{k}: {shape[0]} rows, compact map has {vm['rows']}")
        rows = np.frombuffer(buf, dtype=np.uint8).reshape(shape[0], -1)
        tensors[k] = (dtype, [V, *shape[1:]], rows[row_of])
    write_safetensors(out / "model.safetensors", tensors)
    shutil.copyfile(src / "config.json", out / "config.json")
    shutil.copyfile(src / "generation_config.json", out / "generation_config.json")
    _link_tokenizer(tok or tokenizer_cache(), out)


def _link_tokenizer(tok: Path, out: Path) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        with contextlib.suppress(FileNotFoundError):
            (out / f).unlink()
        try:
            os.link(tok / f, out / f)
        except OSError:
            shutil.copyfile(tok / f, out / f)


# ----------------------------------------------------------------------------- safetensors (no torch)
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], memoryview]]:
    """name -> (dtype, shape, raw bytes), any dtype, no torch."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = memoryview(data)[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], list(v["shape"]), base[a:b])
    return out


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], Any]]) -> None:
    """Tensors sorted by name; data 8-byte aligned header (the format's own writer does the same)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    names = sorted(tensors)
    for k in names:
        dtype, shape, buf = tensors[k]
        size = memoryview(buf).nbytes
        n = _DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        if n != size:
            raise ValueError(f"{k}: {size} bytes for {dtype}{shape}")
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k in names:
            f.write(memoryview(tensors[k][2]).cast("B"))


# ----------------------------------------------------------------------------- cache
def file_sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _inputs_sha256(files: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode() + b"\0")
    for p in files:
        if not Path(p).is_file():
            raise SuiteError(f"{p} is missing; restore models/ from git")
        h.update(Path(p).name.encode() + b"\0" + file_sha256(Path(p)).encode() + b"\0")
    return h.hexdigest()


def cache_intact(folder: Path, key: str | None = None, full: bool = False) -> bool:
    """The stamp exists (with `key` as its inputs' sha256 if given) and every file it lists is there
    with its size (full=True: and its sha256)."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if key is not None and stamp.get("inputs_sha256") != key:
        return False
    for name, meta in stamp.get("files", {}).items():
        p = folder / name
        if not p.is_file() or p.stat().st_size != meta["size"]:
            return False
        if full and file_sha256(p) != meta["sha256"]:
            return False
    return bool(stamp.get("files"))


def _cached(name: str, key: str, build: Callable[[Path], Any]) -> Path:
    final = MATERIALIZED / f"{name}-{key[:12]}"
    if cache_intact(final, key):
        return final
    MATERIALIZED.mkdir(parents=True, exist_ok=True)
    # 30 min: materializing takes ~10 s; a longer wait means a stuck process holds the lock
    with FileLock(MATERIALIZED / f".{name}.lock", 1800, f"model cache lock of {name}"):
        if cache_intact(final, key):  # another worker built it meanwhile
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=MATERIALIZED))
        try:
            t0 = time.time()
            build(tmp)
            files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                     for p in sorted(tmp.iterdir()) if p.is_file()}
            stamp = {"inputs_sha256": key, "files": files, "seconds": round(time.time() - t0, 2),
                     "materialize_version": MATERIALIZE_VERSION}
            (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            if final.exists():  # a broken leftover (we hold the lock)
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if cache_intact(final, key):  # lost a rename race to a worker without the lock
                return final
            raise
        for old in MATERIALIZED.iterdir():
            if old == final or not old.is_dir():
                continue
            if re.fullmatch(re.escape(name) + r"-[0-9a-f]{12}", old.name):  # an older version of the same name
                shutil.rmtree(old, ignore_errors=True)
            elif old.name.startswith(f".{name}-") and ".tmp-" in old.name and time.time() - old.stat().st_mtime > 3600:
                shutil.rmtree(old, ignore_errors=True)  # left by a killed build
    return final


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
