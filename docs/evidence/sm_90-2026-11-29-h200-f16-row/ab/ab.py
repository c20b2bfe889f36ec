"""A/B of kernel sources on the served MoE tiling, one process, rounds interleaved; bit-equality to the first."""
import json, sys, torch
from kernels.tools.bench import random_moe_layer, random_routing, vllm_triton_moe_fn
from kernels.tools.timing import time_calls
from kernels.packed_mm import mxfp4_moe_packed_mm
from kernels.tuning import get_config
from kernels.cases import MOE

srcs = sys.argv[1].split(",")  # "" = the tree's source
ms = [int(v) for v in sys.argv[2].split(",")]
rounds, reps = int(sys.argv[3]), int(sys.argv[4])
gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(11)
base = get_config("packed_mm")
res = {"device": torch.cuda.get_device_name(), "srcs": srcs, "times": {}}
for m in ms:
    x = torch.randn(m, MOE.hidden, generator=g, device="cuda").to(torch.bfloat16)
    logits, ids, wts = random_routing(m, g)
    outs = {}
    for s in srcs:
        cfg = {**base, "impl": "cuda", "cuda_src": s}
        outs[s] = mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, config=cfg).clone()
        same = torch.equal(outs[s], outs[srcs[0]])
        print(f"M={m} {s or 'tree'}: bit-identical to {srcs[0] or 'tree'}: {same}", flush=True)
        res[f"equal_{m}_{s}"] = same
    fn = vllm_triton_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, MOE.top_k)
    out = torch.empty(m, MOE.hidden, dtype=torch.bfloat16, device="cuda")
    t = {s: [] for s in srcs + ["matmul_ogs"]}
    for r in range(rounds):
        t["matmul_ogs"].append(time_calls([lambda: fn(x, logits)], reps, 2))
        for s in (srcs if r % 2 == 0 else srcs[::-1]):
            cfg = {**base, "impl": "cuda", "cuda_src": s}
            t[s].append(time_calls([lambda cfg=cfg: mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, out=out, config=cfg)], reps, 2))
    med = {s: sorted(v)[len(v) // 2] for s, v in t.items()}
    res["times"][m] = {"rounds": t, "median": med}
    ref = med[srcs[0]]
    print(f"M={m}: " + ", ".join(f"{s or 'tree'} {med[s]:.1f} us ({med[s] / ref:.3f}x; rounds {', '.join(f'{v:.1f}' for v in t[s])})" for s in t), flush=True)
json.dump(res, open("/tmp/o/ab.json", "w"), indent=1)
