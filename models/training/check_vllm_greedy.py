#!/usr/bin/env python3
"""Serve the embedded tiny gpt-oss with vLLM (OpenAI server, CPU or GPU) the way the suite does, and
check it against transformers and against its chat tasks.

Boots ``python -m vllm.entrypoints.openai.api_server`` on the materialized checkpoint
(``harness.engine.models.resolve_model``) with the gpt-oss chat flags::

    --dtype bfloat16 --max-model-len 4096 --reasoning-parser openai_gptoss
    --tool-call-parser openai --enable-auto-tool-choice

and the environment of the suite's default CPU config (configs/flavours/cpu.yaml:
``VLLM_SYSTEM_START_DATE=2026-01-01``, ``TIKTOKEN_ENCODINGS_BASE=models/tokenizer``, ``VLLM_CPU_KVCACHE_SPACE=2``), in its own
process group (setsid) on a free 127.0.0.1 port, and always tears the whole group down.

Checks:
1. ``/v1/completions`` greedy (temperature 0, ``ignore_eos``) == transformers' greedy on the same
   materialized checkpoint, token for token, on code prompts; ``heldout.txt`` perplexity through
   ``prompt_logprobs`` vs transformers.
2. ``/v1/chat/completions``: the raw generated ids (``return_token_ids``) == transformers' greedy
   continuation of the prompt vLLM renders (same harmony renderer, in-process); ``reasoning`` and
   ``content`` come back separated; llama-benchy's coherence probe answers Paris; the weather question
   (tool declared) comes back as a ``tool_calls`` entry, and the follow-up with the tool result as content;
   streaming gives reasoning then content deltas.
3. Accuracy on the held-out chat questions (``chat_data.eval_set()``: addition, copy, capitals, tool calls).

    .venv/bin/python models/training/check_vllm_greedy.py [--model tiny-gpt-oss] [--json out.json]

Exit 0 when the greedy comparisons agree and the chat structure checks pass (accuracy is reported,
not gated).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import chat_data  # noqa: E402

from harness.engine.server import free_port  # noqa: E402

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Foo:\n    def __init__(self, name):\n        self.",
    "    for i in range(len(",
]


def post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream(url: str, body: dict, timeout: float = 300) -> list[dict]:
    req = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(), {"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-gpt-oss", help="alias or checkpoint dir (compact dirs are materialized)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--boot-timeout", type=float, default=900)
    ap.add_argument("--log", default="/tmp/check_vllm_greedy.log")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--extra", default="", help="extra server args, space separated")
    args = ap.parse_args(argv)

    from harness.engine import models as hm
    from harness.config.catalog import Catalog

    catalog = Catalog()
    spec = catalog.flavour("cpu").resolve(catalog.default_for("cpu"), "cpu")  # the suite's own CPU server
    chat_flags = [a for a in spec.args if a in ("--reasoning-parser", "openai_gptoss", "--tool-call-parser",
                                                  "openai", "--enable-auto-tool-choice")]

    model = hm.resolve_model(args.model, Path("/tmp"))
    mdir = model.path
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", mdir,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "4096",
           "--served-model-name", "m", *chat_flags, *args.extra.split()]
    env = {**os.environ, **spec.env}
    os.environ.update(spec.env)  # the in-process renderer too
    print("env: " + " ".join(f"{k}={env[k]}" for k in spec.env))
    print("cmd: " + " ".join(cmd))
    logf = open(args.log, "w")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    pgid = os.getpgid(proc.pid)
    base = f"http://127.0.0.1:{port}"
    results: dict = {"model": args.model, "path": mdir, "cmd": cmd[1:], "env": spec.env}
    failures: list[str] = []
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
        results["boot_seconds"] = round(time.time() - t0, 1)
        print(f"vLLM up in {results['boot_seconds']} s ({mdir})")

        import torch
        from transformers import AutoTokenizer, GptOssForCausalLM

        torch.set_num_threads(1)
        tok = AutoTokenizer.from_pretrained(mdir)
        hf = GptOssForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16, attn_implementation="eager").eval()

        # ---- 1. completions greedy
        same_all = True
        for p in PROMPTS:
            out = post(base + "/v1/completions", {"model": "m", "prompt": p, "max_tokens": args.max_tokens,
                                                   "temperature": 0, "logprobs": 2, "ignore_eos": True,
                                                   "return_token_ids": True})
            ch = out["choices"][0]
            ids = tok(p, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                g = hf.generate(ids, max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=None,
                                pad_token_id=199999)
            hf_ids = g[0, ids.shape[1]:].tolist()
            v_ids = ch.get("token_ids") or tok(ch["text"])["input_ids"]
            same = v_ids == hf_ids
            same_all &= same
            print(f"completion {p!r}: vLLM {ch['text']!r}\n   HF {tok.decode(hf_ids)!r} -> {'SAME' if same else 'DIFFERENT'}")
            if not same:
                k = next((i for i, (a, b) in enumerate(zip(v_ids, hf_ids)) if a != b), min(len(v_ids), len(hf_ids)))
                print(f"   first difference at token {k}: vLLM top-2 {ch['logprobs']['top_logprobs'][k] if k < len(v_ids) else None}")
        results["completions_greedy_identical"] = same_all
        if not same_all:
            failures.append("completions greedy differs from transformers")

        held = next(p for p in (Path(args.model) / "heldout.txt", REPO / "models" / "tiny-gpt-oss" / "heldout.txt")
                    if p.is_file())
        text = held.read_text()
        out = post(base + "/v1/completions", {"model": "m", "prompt": text, "max_tokens": 1,
                                               "temperature": 0, "prompt_logprobs": 0}, timeout=900)
        plp = out["choices"][0].get("prompt_logprobs") or out.get("prompt_logprobs")
        v_lps = torch.tensor([next(iter(d.values()))["logprob"] for d in plp[1:]])
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            h = hf.model(input_ids=ids).last_hidden_state[0, :-1]
            hf_lps = torch.cat([torch.log_softmax(hf.lm_head(h[s:s + 256]).float(), -1)
                                .gather(1, ids[0, 1 + s:1 + s + 256, None])[:, 0] for s in range(0, h.shape[0], 256)])
        results["heldout"] = {"tokens": ids.shape[1], "ppl_vllm": round(torch.exp(-v_lps.mean()).item(), 3),
                              "ppl_hf": round(torch.exp(-hf_lps.mean()).item(), 3),
                              "max_abs_logprob_diff": round((v_lps - hf_lps).abs().max().item(), 4)}
        print(f"heldout.txt: {results['heldout']}")

        # ---- 2. chat structure
        def chat(req: dict, max_tokens: int = 96) -> dict:
            body = {"model": "m", "temperature": 0, "max_tokens": max_tokens, "return_token_ids": True, **req}
            return post(base + "/v1/chat/completions", body)

        def hf_chat(req: dict, max_tokens: int = 96) -> list[int]:
            ids = torch.tensor([chat_data.render_prompt(req)])
            with torch.no_grad():
                g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                do_sample=False, eos_token_id=hm.GENERATION_EOS, pad_token_id=199999)
            return g[0, ids.shape[1]:].tolist()

        samples = {}
        probes = {
            "coherence": {"messages": [{"role": "user", "content": "What is the capital of France? Please reply with one word only"}]},
            "addition": {"messages": [{"role": "user", "content": "What is 3 + 5?"}]},
            "copy": {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": "Repeat: apple pear"}]},
            "hello": {"messages": [{"role": "user", "content": "Hello"}]},
            "tool_call": {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                          "tools": [chat_data.WEATHER_TOOL]},
        }
        for name, req in probes.items():
            r = chat(req)
            msg, ch = r["choices"][0]["message"], r["choices"][0]
            out_ids = ch.get("token_ids") or []
            hf_ids = hf_chat(req)
            samples[name] = {"request": req["messages"][-1]["content"], "raw": tok.decode(out_ids),
                             "token_ids_equal_hf": out_ids == hf_ids, "finish_reason": ch.get("finish_reason"),
                             "message": {k: msg.get(k) for k in ("content", "reasoning", "tool_calls")}}
            print(f"chat {name}: raw {samples[name]['raw']!r}\n   message {json.dumps(samples[name]['message'])}"
                  f" finish {ch.get('finish_reason')} ids==HF {out_ids == hf_ids}")
            if out_ids != hf_ids:
                failures.append(f"chat {name}: vLLM ids != transformers greedy")
        c = samples["coherence"]["message"]
        if "paris" not in ((c["content"] or "") + (c["reasoning"] or "")).lower():
            failures.append("coherence probe: no Paris")
        for name in ("coherence", "addition", "copy", "hello"):
            m = samples[name]["message"]
            if not m["content"] or not m["reasoning"] or m["reasoning"] in m["content"]:
                failures.append(f"chat {name}: content/reasoning not separated: {m}")
        tc = samples["tool_call"]["message"]["tool_calls"]
        if not tc or tc[0]["function"]["name"] != "get_weather":
            failures.append(f"tool call missing: {samples['tool_call']['message']}")
        else:
            args_ = json.loads(tc[0]["function"]["arguments"])
            follow = {"messages": [probes["tool_call"]["messages"][0],
                                   {"role": "assistant", "content": None, "tool_calls": [
                                       {"id": tc[0]["id"], "type": "function", "function": tc[0]["function"]}]},
                                   {"role": "tool", "tool_call_id": tc[0]["id"],
                                    "content": json.dumps({"city": args_.get("city"), "temperature": 21, "condition": "sunny"})}],
                      "tools": [chat_data.WEATHER_TOOL]}
            r = chat(follow)
            samples["tool_result"] = {"message": {k: r["choices"][0]["message"].get(k) for k in ("content", "reasoning")},
                                      "raw": tok.decode(r["choices"][0].get("token_ids") or [])}
            print(f"chat tool_result: {json.dumps(samples['tool_result'])}")
            if not samples["tool_result"]["message"]["content"]:
                failures.append("no content after the tool result")
        chunks = stream(base + "/v1/chat/completions", {"model": "m", "temperature": 0, "max_tokens": 64,
                                                         **probes["coherence"]})
        deltas = [ch["choices"][0]["delta"] for ch in chunks if ch.get("choices")]
        kinds = [k for d in deltas for k in ("reasoning", "content") if d.get(k)]
        samples["stream_order"] = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
        print(f"stream: delta kinds in order {samples['stream_order']}")
        if samples["stream_order"] != ["reasoning", "content"]:
            failures.append(f"streaming: expected reasoning then content deltas, got {samples['stream_order']}")
        results["chat_samples"] = samples

        # ---- 3. held-out accuracy
        convs = chat_data.eval_set()

        def ask(c):
            r = chat(c.request, 64)
            m = r["choices"][0]["message"]
            calls = [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]} for t in (m.get("tool_calls") or [])]
            return chat_data.is_correct(c, m.get("content"), calls), m

        with ThreadPoolExecutor(4) as ex:
            answers = list(ex.map(ask, convs))
        acc: dict = {}
        for c, (ok, m) in zip(convs, answers):
            a = acc.setdefault(c.kind, [0, 0])
            a[0] += ok
            a[1] += 1
        results["accuracy"] = {k: f"{v[0]}/{v[1]}" for k, v in acc.items()}
        results["accuracy_total"] = f"{sum(v[0] for v in acc.values())}/{len(convs)}"
        results["wrong"] = [{"q": c.request["messages"][-1]["content"], "expected": c.answer, "got": m}
                            for c, (ok, m) in zip(convs, answers) if not ok][:8]
        print(f"held-out chat accuracy: {results['accuracy_total']} {results['accuracy']}")
        results["failures"] = failures
        print("FAILURES:\n  " + "\n  ".join(failures) if failures else "all checks passed")
        return 1 if failures else 0
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
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
