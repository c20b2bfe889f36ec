"""fp32 reference ops for gpt-oss with MXFP4 weights: the ground truth the fast kernels are checked against.

Everything upcasts to float32 (weights are dequantized exactly), so the only error in a reference
is float32 accumulation (~1e-7 relative), far below the BF16 rounding the kernels are allowed.

Weight arguments accept either packed [..., N, K//2] or the checkpoint's blocks [..., N, K//32, 16];
scales are [..., N, K//32] E8M0 bytes.
"""

from __future__ import annotations

import torch

from .mxfp4 import as_packed, dequantize_mxfp4

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def dequant_weight(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Packed or blocks + scales -> float32 [..., N, K]."""
    return dequantize_mxfp4(as_packed(w, scales), scales, torch.float32)


def mxfp4_linear_ref(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """W4A16 linear: x [M, K] (bf16) @ dequant(W [N, K]).T + bias, in float32 -> [M, N] float32."""
    wf = dequant_weight(w, scales)
    out = x.to(torch.float32) @ wf.T
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out


# --- MoE -----------------------------------------------------------------------------------------


def route(
    x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss router: logits = x @ Wr.T + br; top-k; softmax over the k selected logits.

    Returns (expert ids int64 [M, k], weights float32 [M, k]).
    """
    logits = x.to(torch.float32) @ router_w.to(torch.float32).T
    if router_b is not None:
        logits = logits + router_b.to(torch.float32)
    top_vals, top_ids = torch.topk(logits, top_k, dim=-1)
    return top_ids, torch.softmax(top_vals, dim=-1)


def swiglu_ref(gate_up: torch.Tensor, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """gpt-oss clamped SwiGLU on INTERLEAVED gate/up ([..., 2I] -> [..., I])."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


def moe_experts_ref(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """Experts part of the MoE block, given routing: sum_j w[t,j] * expert_{id[t,j]}(x[t]) -> [M, H] fp32.

    Only the selected experts are dequantized (the reference must stay cheap at 128 experts).
    """
    xf = x.to(torch.float32)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in expert_ids.unique().tolist():
        tok, slot = torch.where(expert_ids == e)
        w1 = dequant_weight(gate_up_blocks[e], gate_up_scales[e])  # [2I, H]
        w2 = dequant_weight(down_blocks[e], down_scales[e])  # [H, I]
        h = xf[tok] @ w1.T
        if gate_up_bias is not None:
            h = h + gate_up_bias[e].to(torch.float32)
        y = swiglu_ref(h) @ w2.T
        if down_bias is not None:
            y = y + down_bias[e].to(torch.float32)
        out.index_add_(0, tok, y * expert_weights[tok, slot].to(torch.float32).unsqueeze(-1))
    return out


def moe_ref(
    x: torch.Tensor,
    router_w: torch.Tensor,
    router_b: torch.Tensor | None,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
    top_k: int,
) -> torch.Tensor:
    """The gpt-oss MoE block: x [M, H] -> [M, H] float32.

    gate_up_blocks [E, 2I, H//32, 16] (rows interleaved gate, up, gate, up, ...), gate_up_scales
    [E, 2I, H//32], gate_up_bias [E, 2I]; down_blocks [E, H, I//32, 16], down_scales [E, H, I//32],
    down_bias [E, H]; router_w [E, H], router_b [E].
    """
    ids, weights = route(x, router_w, router_b, top_k)
    return moe_experts_ref(
        x, ids, weights, gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks, down_scales, down_bias
    )


# --- attention -----------------------------------------------------------------------------------


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    sm_scale: float,
    sliding_window: int | None = None,
    q_start: int | None = None,
) -> torch.Tensor:
    """Causal GQA attention for ONE sequence with gpt-oss sinks and an optional sliding window, fp32.

    q [Tq, Hq, D]; k, v [Tk, Hkv, D]; query i sits at position q_start + i (default Tk - Tq, i.e. the
    queries are the last Tq tokens of the context: prefill when Tq == Tk, decode when Tq == 1).
    Query at position p sees keys j with j <= p and p - j < sliding_window (window counts the query
    itself, as transformers' sliding mask and vLLM's window (W-1, 0)).
    Sinks: one learned logit per query head that joins the softmax denominator and is then dropped.
    Returns [Tq, Hq, D] float32.
    """
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    if hq % hkv:
        raise ValueError(f"query heads {hq} not a multiple of kv heads {hkv}")
    start = tk - tq if q_start is None else q_start
    qf, kf, vf = (t.to(torch.float32) for t in (q, k, v))
    rep = hq // hkv
    kf = kf.repeat_interleave(rep, dim=1)  # query head h uses kv head h // rep
    vf = vf.repeat_interleave(rep, dim=1)
    logits = torch.einsum("qhd,khd->hqk", qf, kf) * sm_scale
    qpos = torch.arange(start, start + tq, device=q.device).unsqueeze(1)
    kpos = torch.arange(tk, device=q.device).unsqueeze(0)
    allowed = kpos <= qpos
    if sliding_window is not None:
        allowed = allowed & (qpos - kpos < sliding_window)
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.to(torch.float32).view(hq, 1, 1).expand(hq, tq, 1)
        logits = torch.cat((logits, sink), dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, vf)


def gather_paged_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, layout: str
) -> torch.Tensor:
    """One sequence's keys (or values) from a paged cache -> [seq_len, Hkv, D].

    NHD: cache [num_blocks, block_size, Hkv, D]; HND: cache [num_blocks, Hkv, block_size, D].
    Token t lives in block block_table_row[t // block_size], slot t % block_size.
    """
    if layout == "NHD":
        block_size = cache.shape[1]
        blocks = cache[block_table_row.long()]  # [nb, bs, H, D]
    elif layout == "HND":
        block_size = cache.shape[2]
        blocks = cache[block_table_row.long()].transpose(1, 2)  # [nb, bs, H, D]
    else:
        raise ValueError(f"layout must be 'NHD' or 'HND', got {layout!r}")
    n_blocks = -(-seq_len // block_size)
    return blocks[:n_blocks].reshape(n_blocks * block_size, *blocks.shape[2:])[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    sinks: torch.Tensor | None,
    sm_scale: float,
    sliding_window: int | None = None,
    layout: str = "NHD",
) -> torch.Tensor:
    """Batched prefill/decode over a paged KV cache (vLLM's varlen convention), fp32.

    q [total_q, Hq, D]: sequence b owns rows query_start_loc[b]:query_start_loc[b+1], which are the
    last (query_len) tokens of its seq_lens[b]-token context (decode: query_len 1; prefill: the
    whole sequence; chunked prefill: anything in between). Returns [total_q, Hq, D] float32.
    """
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(seq_lens.shape[0]):
        s, e = int(query_start_loc[b]), int(query_start_loc[b + 1])
        n = int(seq_lens[b])
        k = gather_paged_kv(k_cache, block_table[b], n, layout)
        v = gather_paged_kv(v_cache, block_table[b], n, layout)
        out[s:e] = attention_ref(q[s:e], k, v, sinks, sm_scale, sliding_window)
    return out


def attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    sm_scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Loop-by-loop float64 version of `attention_ref` (one query, one head at a time), used only to
    check the vectorized reference; deliberately written without masks or einsum."""
    import math

    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    rep = hq // hkv
    out = torch.zeros(tq, hq, d, dtype=torch.float64)
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    for i in range(tq):
        p = tk - tq + i
        lo = 0 if sliding_window is None else max(0, p - sliding_window + 1)
        for h in range(hq):
            kv = h // rep
            scores = [float(q64[i, h] @ k64[j, kv]) * sm_scale for j in range(lo, p + 1)]
            terms = scores + ([float(sinks[h])] if sinks is not None else [])
            m = max(terms)
            den = sum(math.exp(t - m) for t in terms)
            for idx, j in enumerate(range(lo, p + 1)):
                out[i, h] += math.exp(scores[idx] - m) / den * v64[j, kv]
    return out
