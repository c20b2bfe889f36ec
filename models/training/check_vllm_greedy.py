#!/usr/bin/env python3
"""Serve a checkpoint with vLLM (OpenAI server, CPU or GPU) and compare its greedy completions
with transformers' greedy generation of the same checkpoint.

Boots ``python -m vllm.entrypoints.openai.api_server`` in its own process group (setsid) on a
free 127.0.0.1 port, waits for /health, sends greedy /v1/completions (temperature 0, logprobs),
compares token by token with ``GptOssForCausalLM.generate(do_sample=False)`` in BF16, and
always tears the whole process group down (SIGTERM, wait, SIGKILL).

    .venv/bin/python models/training/check_vllm_greedy.py [--model models/tiny-gpt-oss] [--max-tokens 32]

Exit 0 when every prompt's greedy tokens agree; a mismatch is reported with the first differing
position and both top-1 logprob margins (a near-tie there means BF16 rounding, not a bug).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Foo:\n    def __init__(self, name):\n        self.",
    "    for i in range(len(",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models/tiny-gpt-oss"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--boot-timeout", type=float, default=600)
    ap.add_argument("--log", default="/tmp/check_vllm_greedy.log")
    ap.add_argument("--extra", default="", help="extra server args, space separated")
    args = ap.parse_args(argv)

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "4096",
           "--served-model-name", "m", *args.extra.split()]
    logf = open(args.log, "w")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    pgid = os.getpgid(proc.pid)
    base = f"http://127.0.0.1:{port}"
    rc = 1
    try:
        while True:
            if proc.poll() is not None:
                print(f"server exited with {proc.returncode} during boot; log: {args.log}")
                return 2
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.time() - t0 > args.boot_timeout:
                print(f"no /health after {args.boot_timeout} s; log: {args.log}")
                return 2
            time.sleep(2)
        print(f"vLLM up in {time.time() - t0:.1f} s ({args.model})")

        import torch
        from transformers import AutoTokenizer, GptOssForCausalLM

        torch.set_num_threads(1)
        tok = AutoTokenizer.from_pretrained(args.model)
        model = GptOssForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="eager").eval()
        all_same = True
        for p in PROMPTS:
            out = post(base + "/v1/completions", {"model": "m", "prompt": p, "max_tokens": args.max_tokens,
                                                   "temperature": 0, "logprobs": 2, "ignore_eos": True})
            ch = out["choices"][0]
            v_tokens = ch["logprobs"]["tokens"]
            v_top = ch["logprobs"]["top_logprobs"]
            ids = tok(p, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                g = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False,
                                   output_scores=True, return_dict_in_generate=True,
                                   eos_token_id=None, pad_token_id=tok.eos_token_id)
            hf_ids = g.sequences[0, ids.shape[1]:].tolist()
            hf_text = tok.decode(hf_ids)
            same = hf_text == ch["text"]
            all_same &= same
            print(f"{p!r}: vLLM {ch['text']!r}\n{'':{len(repr(p)) + 2}}HF   {hf_text!r}  -> {'SAME' if same else 'DIFFERENT'}")
            if not same:
                hf_toks = [tok.decode([i]) for i in hf_ids]
                k = next((i for i, (a, b) in enumerate(zip(v_tokens, hf_toks)) if a != b), min(len(v_tokens), len(hf_toks)))
                lp = torch.log_softmax(g.scores[k][0].float(), -1).topk(2).values.tolist() if k < len(g.scores) else []
                vt = sorted(v_top[k].values(), reverse=True) if k < len(v_top) else []
                print(f"   first difference at token {k}: vLLM {v_tokens[k:k+1]} top-2 logprobs {vt}; "
                      f"HF {hf_toks[k:k+1]} top-2 logprobs {lp}")
        # heldout.txt perplexity through prompt_logprobs (what the level 2 perplexity test does)
        held = Path(args.model, "heldout.txt")
        if held.is_file():
            text = held.read_text()
            out = post(base + "/v1/completions", {"model": "m", "prompt": text, "max_tokens": 1,
                                                   "temperature": 0, "prompt_logprobs": 0})
            plp = out["choices"][0].get("prompt_logprobs") or out.get("prompt_logprobs")
            v_lps = [next(iter(d.values()))["logprob"] for d in plp[1:]]
            ids = tok(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1], -1)
            hf_lps = lp.gather(1, ids[0, 1:, None])[:, 0]
            v = torch.tensor(v_lps)
            print(f"heldout.txt: {ids.shape[1]} tokens (vLLM {len(v_lps) + 1}); perplexity vLLM "
                  f"{torch.exp(-v.mean()).item():.3f}, HF {torch.exp(-hf_lps.mean()).item():.3f}; "
                  f"max |token logprob diff| {(v - hf_lps).abs().max().item():.4f}")
        rc = 0 if all_same else 1
        print("greedy: all prompts identical" if all_same else "greedy: some prompts differ")
        return rc
    finally:
        try:
            os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        logf.close()


if __name__ == "__main__":
    sys.exit(main())
