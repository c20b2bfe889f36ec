"""A/B of prefill variants of one kernel source on the gpt-oss-120b MoE layer, rounds interleaved; bit-equality."""
import json, sys, torch
from pathlib import Path
from kernels import cuda_ext
from kernels.tools.bench import random_moe_layer, random_routing, vllm_triton_moe_fn
from kernels.tools.timing import time_calls
from kernels.packed_mm import mxfp4_moe_packed_mm
from kernels.tuning import get_config
from kernels.cases import MOE

src = sys.argv[1]
variants = [int(v) for v in sys.argv[2].split(",")]
ms = [int(v) for v in sys.argv[3].split(",")]
rounds, reps = int(sys.argv[4]), int(sys.argv[5])
cuda_ext.PF_VARIANTS[:] = cuda_ext.source_pf_variants(Path(src).read_text())
cuda_ext.SRC = Path(src)  # the library every check loads (prefill_available), not the tree's
print("prefill_available", cuda_ext.prefill_available(), flush=True)
assert cuda_ext.prefill_available()[0]
print("table", cuda_ext.PF_VARIANTS, flush=True)
gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(11)
base = get_config("packed_mm")
res = {"device": torch.cuda.get_device_name(), "src": src, "table": cuda_ext.PF_VARIANTS, "times": {}}
for m in ms:
    x = torch.randn(m, MOE.hidden, generator=g, device="cuda").to(torch.bfloat16)
    logits, ids, wts = random_routing(m, g)
    hits = torch.bincount(ids.flatten().long(), minlength=MOE.experts)
    print(f"M={m}: slots per expert min {int(hits.min())} median {int(hits.median())} max {int(hits.max())}", flush=True)
    cfgs = {v: {**base, "impl": "cuda", "cuda_src": src, "cuda_variant": v} for v in variants}
    outs = {}
    for v in variants:
        outs[v] = mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, config=cfgs[v]).clone()
        same = torch.equal(outs[v], outs[variants[0]])
        print(f"M={m} variant {v} {cuda_ext.PF_VARIANTS[v]}: bit-identical to variant {variants[0]}: {same}", flush=True)
        res[f"equal_{m}_{v}"] = same
    fn = vllm_triton_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, MOE.top_k)
    out = torch.empty(m, MOE.hidden, dtype=torch.bfloat16, device="cuda")
    t = {str(v): [] for v in variants}
    t["matmul_ogs"] = []
    for r in range(rounds):
        t["matmul_ogs"].append(time_calls([lambda: fn(x, logits)], reps, 2))
        for v in (variants if r % 2 == 0 else variants[::-1]):
            t[str(v)].append(time_calls([lambda c=cfgs[v]: mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, out=out, config=c)], reps, 2))
    med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
    res["times"][m] = {"rounds": t, "median": med}
    ref = med[str(variants[0])]
    print(f"M={m}: " + ", ".join(f"{k} {med[k]:.1f} us ({med[k] / ref:.3f}x; rounds {', '.join(f'{x:.1f}' for x in t[k])})" for k in t), flush=True)
json.dump(res, open("/tmp/o/ab2.json", "w"), indent=1)
