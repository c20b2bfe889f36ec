"""vLLM plugin: serve gpt-oss MXFP4 layers with this repository's kernels (`kernels/`), one copy of the weights.

vLLM finds it through the `vllm.general_plugins` entry point of the hand-written
`suite_kernels-0.0.0.dist-info` next to it, once `<repo>/plugins/site` is on the server's PYTHONPATH
(`harness.engine.hooks.server_env`, used by `Suite.boot`). No file of vLLM is edited: methods are wrapped at
class level (MoE) or a module's `quant_method` is replaced (dense). Off unless a configuration sets:

  SUITE_KERNELS=moe         gpt-oss MXFP4 experts (`GptOssMxfp4MoEMethod`): repacked into our layout at load
                            and vLLM's tensors freed; routing from vLLM's router logits; M <= the threshold:
                            the CUDA decode kernels (route, gate_up + SwiGLU, down + combine); above it the
                            grouped tensor-core GEMMs of `kernels.packed_mm` on the same packed bytes.
  SUITE_KERNELS=moe,dense   also qkv_proj, o_proj and lm_head quantized to MXFP4 at load (the fork's
                            --mxfp4-layers all), their BF16 weights freed, every M served from the MXFP4
                            copy (`kernels.gemv.mxfp4_linear`: decode kernels up to the threshold, packed_mm above).
  SUITE_KERNELS_MAX_M=16    the threshold, 1..16 (default: kernels/tuning.yaml gemv.small_m_threshold).
  SUITE_KERNELS_ROUTE=fused with moe: batches up to the threshold route from x in one launch (router GEMV + top-k,
                            `kernels.moe.route_packed`) and vLLM's router GEMM is skipped for them (its module
                            answers with an unfilled tensor the MoE never reads); default `vllm`: vLLM's router
                            logits at every M. Opt-in until a served A/B shows the engine clock gains.

Memory: one copy. vLLM's own MXFP4 backends do the same (they replace `w13_weight` / `w2_weight` with
their repacked tensor after load); keeping vLLM's experts beside ours doubled them (~61 GB more on the
gpt-oss-120b shape: it could not load on an 80 GB GPU). Packing goes layer by layer, so the transient
is one layer's experts.

The kernels must be the GPU ones: enabling the plugin where the CUDA extension cannot be built is an error at
load (one line naming why), never a silent fallback to slower kernels.
"""
from __future__ import annotations

import copy
import functools
import os
import re
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

ENV = "SUITE_KERNELS"
MAX_M_ENV = "SUITE_KERNELS_MAX_M"
ROUTE_ENV = "SUITE_KERNELS_ROUTE"
ROUTES = ("vllm", "fused")
PARTS = ("moe", "dense")
# the repository root: `kernels` lives there (plugins/site/suite_kernels/__init__.py -> repo)
REPO = Path(__file__).resolve().parents[3]
DENSE_NAMES = re.compile(r"(^|\.)(qkv_proj|o_proj|lm_head)$")
_MARK = "_suite_kernels"
MOE_ATTR = "_suite_kernels_moe"
# on the MoE layer the plugin packed: (router weight, router bias), set at load together with the router module's
# method, so the MoE routes from x for exactly the batches whose router GEMM was skipped
ROUTER_ATTR = "_suite_kernels_router"


def wanted(env: dict[str, str] | None = None) -> set[str]:
    """The parts SUITE_KERNELS asks for; an unknown part is an error (a typo must not mean "stock")."""
    raw = (os.environ if env is None else env).get(ENV, "")
    parts = {p.strip() for p in raw.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        raise ValueError(f"{ENV}={raw!r}: unknown part(s) {sorted(unknown)}; use any of {list(PARTS)}")
    return parts


def route(env: dict[str, str] | None = None) -> str:
    """Who routes decode batches: `vllm` (its router GEMM, our top-k; the default) or `fused` (one launch from x)."""
    env = os.environ if env is None else env
    raw = env.get(ROUTE_ENV, "").strip() or ROUTES[0]
    if raw not in ROUTES:
        raise ValueError(f"{ROUTE_ENV}={raw!r}: use one of {list(ROUTES)}")
    if raw == "fused" and "moe" not in wanted(env):
        raise ValueError(f"{ROUTE_ENV}=fused routes for the plugin's MoE: add moe to {ENV}")
    return raw


def max_m(env: dict[str, str] | None = None) -> int:
    """The largest batch the CUDA decode kernels serve: SUITE_KERNELS_MAX_M, else tuning.yaml's
    gemv.small_m_threshold for this device (which asks the device: call it where the weights load, never in
    `register`). Above it, kernels.packed_mm. Refused outside 1..16: above 16 the decode kernels cannot run and
    dense batches would go to the slow portable Triton path while the log said "decode kernels"; below 1 no decode
    batch would reach them."""
    env = os.environ if env is None else env
    _import_kernels()
    from kernels.cuda_ext import CUDA_MAX_M

    raw = env.get(MAX_M_ENV, "").strip()
    if raw:
        where = f"{MAX_M_ENV}={raw!r}"
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{where} is not an integer: use 1..{CUDA_MAX_M} or unset it") from None
    else:
        from kernels.tuning import get_config

        value = get_config("gemv")["small_m_threshold"]
        where = f"gemv.small_m_threshold {value!r} (kernels/tuning.yaml or KERNELS_GEMV_SMALL_M_THRESHOLD)"
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{where} is not an integer: use 1..{CUDA_MAX_M}")
    if not 1 <= value <= CUDA_MAX_M:
        raise ValueError(f"{where}: the plugin's decode kernels serve 1..{CUDA_MAX_M} tokens; use a value in that range")
    return value


@functools.lru_cache(maxsize=1)
def load_threshold() -> int:
    """max_m() of this process, read once where the weights load (the env does not change while it serves)."""
    return max_m()


def check_env(env: dict[str, str] | None = None) -> set[str]:
    """The parts SUITE_KERNELS asks for, every SUITE_KERNELS_* variable checked without touching the device (vLLM
    calls `register` in its API server too): a typo, a threshold that is not 1..16 as a number, or a setting for a
    plugin that is off is one line before anything loads (a fused route without the plugin had run stock under the
    route's name)."""
    env = os.environ if env is None else env
    parts = wanted(env)
    stray = sorted(k for k in (MAX_M_ENV, ROUTE_ENV) if env.get(k, "").strip())
    if not parts:
        if stray:
            raise ValueError(f"{', '.join(stray)} set without {ENV}: the plugin is off, so nothing would use it; set "
                             f"{ENV} (e.g. moe) or unset {' and '.join(stray)}")
        return parts
    route(env)
    raw = env.get(MAX_M_ENV, "").strip()
    if raw:
        max_m(env)  # only the variable's own value: no tuning lookup, no device
    return parts


def _import_kernels() -> None:
    """Make this repository's `kernels` importable, and make sure it is the one imported: another
    distribution named `kernels` (e.g. Hugging Face's kernel hub) must not be used silently."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import kernels

    where = Path(getattr(kernels, "__file__", "") or "").resolve()
    if where.parent != REPO / "kernels":
        raise RuntimeError(f"{ENV}: `import kernels` gives {where}, not {REPO / 'kernels'}; another package named "
                           f"kernels is installed or imported first")


def require_cuda_kernels() -> None:
    import torch

    _import_kernels()
    if not torch.cuda.is_available():
        raise RuntimeError(f"{ENV} needs a CUDA GPU: the plugin's kernels run in CUDA graphs; unset {ENV} on this machine")
    from kernels import cuda_ext

    ok, why = cuda_ext.available()
    if not ok:
        first = (why.strip().splitlines() or ["no reason given"])[0]
        raise RuntimeError(f"{ENV}: the CUDA extension of kernels/ cannot be used ({first}); without it decode "
                           f"would read expert ids on the host, which CUDA graphs cannot capture: fix that, or use a "
                           f"config without the plugin (unset {ENV})")


# ---------------------------------------------------------------------------------------------- MoE


@dataclass
class PackedExperts:
    gate_up: object  # kernels.packed.PackedMXFP4 [E, 2I, H], gate/up rows paired
    gate_up_bias: object  # [E, 2I] in vLLM's (interleaved) row order, or None
    down: object  # PackedMXFP4 [E, H, I]
    down_bias: object  # [E, H] or None
    # the width vLLM allocated for its backend, hands x in and takes the output back in, where packing left its
    # padding out (`model_sizes`); None: the packed H is that width
    hidden_padded: int | None = None


def model_sizes(layer) -> tuple[int, int] | None:
    """(H, I) of the model, where vLLM allocated the experts larger for its backend, else None.

    vLLM sizes the MXFP4 experts for the backend it picked: for Marlin, GB10's default, it rounds H up to 256 and I
    to 128 (gpt-oss: 2880 -> 3072 and 2880 -> 2944). The loader writes the model's experts into the leading rows and
    columns and the rest stays zero. Its MoE config keeps the model's own sizes (`hidden_dim_unpadded`,
    `intermediate_size_per_partition_unpadded`). Packing only those reads ~9% fewer bytes per token and holds ~9% less
    memory. Sizes our packing cannot tile (K a multiple of 64, N of 16) keep the padding."""
    cfg = getattr(layer, "moe_config", None)
    h = getattr(cfg, "hidden_dim_unpadded", None)
    i = getattr(cfg, "intermediate_size_per_partition_unpadded", None)
    if not isinstance(h, int) or not isinstance(i, int):
        return None
    _, two_i_alloc, half_h_alloc = layer.w13_weight.shape
    h_alloc, i_alloc = 2 * half_h_alloc, two_i_alloc // 2
    if (h, i) == (h_alloc, i_alloc) or not (0 < h <= h_alloc and 0 < i <= i_alloc) or h % 64 or i % 64:
        return None
    return h, i


_said: set[str] = set()


def _say_packed_size(layer, p: PackedExperts) -> None:
    """One line per process: the sizes packed against the sizes vLLM allocated (the server log shows whether a
    backend's padding was left out, or kept because vLLM's MoE config did not give the model's own sizes)."""
    alloc = (2 * layer.w13_weight.shape[2], layer.w13_weight.shape[1] // 2)
    line = f"suite_kernels: experts packed at H {p.gate_up.k}, I {p.down.k}"
    if alloc != (p.gate_up.k, p.down.k):
        line += f" (vLLM allocated H {alloc[0]}, I {alloc[1]} for its backend)"
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def pack_experts(layer) -> PackedExperts:
    """Our packed copy of a gpt-oss MXFP4 expert layer, from the tensors vLLM loaded (before its own
    backend repacks them): w13_weight uint8 [E, 2I, H/2] (gate/up rows interleaved, low nibble = even
    element), w13_weight_scale uint8 E8M0 [E, 2I, H/32], w2_weight [E, H, I/2], w2_weight_scale,
    w13_bias [E, 2I], w2_bias [E, H]; where vLLM padded I and H for its backend, only the model's own
    (`model_sizes`)."""
    _import_kernels()
    from kernels.moe import pack_moe_experts

    w13, s13, w2, s2 = (layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data,
                        layer.w2_weight_scale.data)
    gub = getattr(layer, "w13_bias", None)
    dnb = getattr(layer, "w2_bias", None)
    gub, dnb = (None if gub is None else gub.data), (None if dnb is None else dnb.data)
    sizes = model_sizes(layer)
    if sizes is None:
        gu, dn = pack_moe_experts(w13, s13, w2, s2)
        return PackedExperts(gu, gub, dn, dnb)
    h, i = sizes
    # gate/up rows are interleaved (2j gate, 2j + 1 up), so the model's I pairs are the leading 2I rows
    gu, dn = pack_moe_experts(w13[:, : 2 * i, : h // 2].contiguous(), s13[:, : 2 * i, : h // 32].contiguous(),
                              w2[:, :h, : i // 2].contiguous(), s2[:, :h, : i // 32].contiguous())
    # biases contiguous once here: the kernels' launchers would copy a strided one on every call
    return PackedExperts(gu, None if gub is None else gub[:, : 2 * i].contiguous(), dn,
                         None if dnb is None else dnb[:, :h].contiguous(), hidden_padded=2 * w13.shape[2])


EXPERT_TENSORS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")


def free_expert_tensors(layer) -> None:
    """Drop vLLM's copy of the experts (ours is the only one now): each parameter becomes an empty tensor of
    its dtype, so attribute lookups still work and nothing holds the memory."""
    import torch

    for name in EXPERT_TENSORS:
        t = getattr(layer, name, None)
        if isinstance(t, torch.Tensor):
            setattr(layer, name, torch.nn.Parameter(t.new_empty(0), requires_grad=False))
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next layer's pack reuses the blocks; what is left goes back at the end


def route_from_logits(router_logits, top_k: int):
    """gpt-oss routing from vLLM's router logits: top-k, softmax over the k (= softmax over all
    experts renormalised over the top k). (ids int32 [M, k], weights float32 [M, k])."""
    import torch

    if router_logits.is_cuda:  # one launch instead of torch's topk + sort + softmax
        _import_kernels()
        from kernels import cuda_ext

        if cuda_ext.topk_supported(router_logits.shape[-1], top_k) and cuda_ext.available()[0]:
            return cuda_ext.topk_from_logits(router_logits, top_k)
    vals, ids = torch.topk(router_logits.float(), top_k, dim=-1)
    return ids.to(torch.int32), torch.softmax(vals, dim=-1)


def route_for_batch(layer, x, router_logits, top_k: int, threshold: int):
    """(ids, weights) of a MoE call. Where the plugin took over the layer's router (ROUTER_ATTR) and the batch is a
    decode batch, from x and the router's weights in one launch (`kernels.moe.route_packed`: GEMV + top-k +
    softmax; vLLM's logits are an unfilled tensor then); otherwise from vLLM's logits. In one process on an H200
    (`python -m kernels.tools.decode_sequence`), vLLM's cuBLAS router GEMM then our top-k cost 3.8 us per layer
    more than the one launch: cuBLAS does not start the next kernel early (programmatic dependent launch)."""
    linked = getattr(layer, ROUTER_ATTR, None)
    if linked is not None and x.shape[0] <= threshold:
        _import_kernels()
        from kernels.moe import route_packed

        # a backend that pads the MoE's hidden size pads x with zero columns too (Marlin, GB10's default: 2880 ->
        # 3072); the router has the model's own columns
        return route_packed(x[:, : linked[0].shape[1]], linked[0], linked[1], top_k)
    return route_from_logits(router_logits, top_k)


def run_experts(x, ids, weights, p: PackedExperts, threshold: int = 16):
    """[M, H] bf16: the experts on our packed copy, weighted and summed (what vLLM's MoE returns). The decode
    kernels serve M <= threshold, the grouped tensor-core GEMMs (kernels.packed_mm) every larger M."""
    import torch

    _import_kernels()
    from kernels.moe import mxfp4_moe_packed
    from kernels.packed_mm import mxfp4_moe_packed_mm

    ids, weights = ids.to(torch.int32), weights.float()
    if p.hidden_padded is not None:  # vLLM padded x for its backend: its zero columns left out
        x = x[:, : p.gate_up.k]
    run = mxfp4_moe_packed if x.shape[0] <= threshold else mxfp4_moe_packed_mm
    out = run(x, ids, weights, p.gate_up, p.gate_up_bias, p.down, p.down_bias)
    if p.hidden_padded is None:
        return out
    return torch.nn.functional.pad(out, (0, p.hidden_padded - out.shape[1]))  # the width vLLM allocated, zeros


def packed_experts(layer) -> PackedExperts:
    p = getattr(layer, MOE_ATTR, None)
    if p is None:
        raise RuntimeError(f"{ENV}=moe: MoE layer {getattr(layer, 'layer_name', type(layer).__name__)} was not packed "
                           f"at load (its process_weights_after_loading did not run through the plugin)")
    return p


def patch_moe(cls, threshold: int | None = None) -> None:
    """Wrap the MoE method class (vLLM's GptOssMxfp4MoEMethod): keyword names as vLLM passes them. Every M
    runs on our packed copy (`kernels.moe.mxfp4_moe_packed` picks the decode kernels up to `threshold`; None: this
    process's `load_threshold()`, read when the first layer loads, so that registering asks no device)."""
    if getattr(cls.process_weights_after_loading, _MARK, False):
        return
    limit = threshold

    def threshold_now() -> int:
        return limit if limit is not None else load_threshold()

    @functools.wraps(cls.process_weights_after_loading)
    def process_weights_after_loading(self, layer):
        require_cuda_kernels()
        threshold_now()  # a bad threshold fails at load, not at the first request
        packed = pack_experts(layer)  # from the loaded tensors, before any backend repacks
        setattr(layer, MOE_ATTR, packed)
        _say_packed_size(layer, packed)
        free_expert_tensors(layer)
        # vLLM's backend is never set up (its kernel would need the tensors just freed); the runner asks for a
        # quant config on the first forward, which must not build that backend's either
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)

    @functools.wraps(cls.apply_monolithic)
    def apply_monolithic(self, layer, x, router_logits, input_ids=None, **kwargs):
        threshold = threshold_now()
        ids, wts = route_for_batch(layer, x, router_logits, layer.top_k, threshold)
        return run_experts(x, ids, wts, packed_experts(layer), threshold)

    @functools.wraps(cls.apply)
    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None, **kwargs):
        if shared_experts is not None:
            raise RuntimeError(f"{ENV}=moe: shared experts are not part of gpt-oss; unset {ENV} for this model")
        threshold = threshold_now()
        if getattr(layer, ROUTER_ATTR, None) is not None and x.shape[0] <= threshold:
            # vLLM routed this decode batch from the router's unfilled logits: route it from x instead
            topk_ids, topk_weights = route_for_batch(layer, x, None, layer.top_k, threshold)
        return run_experts(x, topk_ids, topk_weights, packed_experts(layer), threshold)

    @functools.wraps(cls.get_fused_moe_quant_config)
    def get_fused_moe_quant_config(self, layer):
        # asked by vLLM outside the forward too (its DeepGEMM warm-up): vLLM's answer would read the freed
        # tensors' backend state; a packed layer has no vLLM quant config to give
        if getattr(layer, MOE_ATTR, None) is not None:
            from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG

            return FUSED_MOE_UNQUANTIZED_CONFIG
        return orig_config(self, layer)

    orig_config = cls.get_fused_moe_quant_config
    for f in (process_weights_after_loading, apply_monolithic, apply, get_fused_moe_quant_config):
        setattr(f, _MARK, True)
    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply_monolithic = apply_monolithic
    cls.apply = apply
    cls.get_fused_moe_quant_config = get_fused_moe_quant_config


# -------------------------------------------------------------------------------------------- dense


# words.data_ptr() -> kernels.gemv.PackedLinear of a layer swapped at load; weak, so a freed layer's entry goes with it
_linears: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _linear_for(words, scales, n: int, k: int, max_m: int):
    """The layer's PackedLinear (made at load), or one made now for packed tensors this plugin did not make."""
    lin = _linears.get(words.data_ptr())
    if lin is None or (lin.p.n, lin.p.k, lin.threshold, lin.p.scales.data_ptr()) != (n, k, max_m, scales.data_ptr()):
        from kernels.gemv import PackedLinear
        from kernels.packed import PackedMXFP4

        from kernels.cuda_ext import BF16_MAX_SCALE

        # max_scale unknown here and reading it would sync the host (maybe inside a graph capture): claim one above
        # the bf16 form's limit, so large M takes the f16 form, which serves every scale byte
        lin = PackedLinear(PackedMXFP4(words, scales, n, k, max_scale=BF16_MAX_SCALE + 1), max_m)
    return lin


def _linear_op():
    """`torch.ops.suite_kernels.mxfp4_linear`: a custom op, so that torch.compile (vLLM compiles the
    decoder layers) treats our kernel as one opaque call instead of tracing into ctypes launches."""
    import torch

    if hasattr(torch.ops, "suite_kernels") and hasattr(torch.ops.suite_kernels, "mxfp4_linear"):
        return torch.ops.suite_kernels.mxfp4_linear
    _import_kernels()

    # explicit schema: this module's annotations are strings (__future__), which custom_op cannot read
    @torch.library.custom_op("suite_kernels::mxfp4_linear", mutates_args=(), schema=(
        "(Tensor x, Tensor words, Tensor scales, Tensor? bias, SymInt n, SymInt k, SymInt max_m) -> Tensor"))
    def mxfp4_linear(x, words, scales, bias, n, k, max_m):
        return dense_forward(_linear_for(words, scales, n, k, max_m), x, bias)

    @mxfp4_linear.register_fake
    def _(x, words, scales, bias, n, k, max_m):
        return x.new_empty((*x.shape[:-1], n))

    return torch.ops.suite_kernels.mxfp4_linear


def dense_forward(linear, x, bias=None):
    """A dense layer on our kernels: `linear` is the layer's kernels.gemv.PackedLinear."""
    p = linear.p
    m = x.numel() // p.k
    if (p.n, p.k, m) not in _seen_paths:  # the path is looked up once per shape and M: the eager lm_head runs here
        _note_path(p.n, p.k, m, linear.path(m))  # every decode step, where each host microsecond counts
    return linear(x, bias).to(x.dtype)


_seen_paths: set[tuple] = set()


def _note_path(n: int, k: int, m: int, path: str) -> None:
    """One server-log line per (shape, M) the first time it runs (eagerly or at CUDA-graph capture), so a log
    shows which dense layers our kernels serve at which batch sizes, and how."""
    key = (n, k, m)
    if key not in _seen_paths and len(_seen_paths) < 256:
        _seen_paths.add(key)
        print(f"suite_kernels: mxfp4_linear {n}x{k} M={m} -> {path}", file=sys.stderr, flush=True)


DENSE_ATTR = "_suite_kernels_dense"
_dense_classes: dict[type, type] = {}


def _dense_apply(self, layer, x, bias=None):
    import torch

    linear, op = getattr(self, DENSE_ATTR)
    if torch.compiler.is_compiling():  # traced by torch.compile: one opaque op in the graph
        p = linear.p
        return op(x, p.words, p.scales, bias, p.n, p.k, linear.threshold)
    # eager (vLLM's logits every decode step, --enforce-eager): the same function without the custom op's
    # dispatch, which costs ~30 us of host time per call (H100 host: 79 against 47 us, scripts/lm_head_host_cost.py)
    return dense_forward(linear, x, bias)


def dense_method(original, layer, threshold: int):
    """A copy of the layer's `quant_method` whose class is a subclass of vLLM's (so vLLM's isinstance
    checks still see an unquantized method) with `apply` replaced: the MXFP4 copy of the weight for every M
    (the caller frees the BF16 weight)."""
    _import_kernels()
    from kernels.gemv import PackedLinear
    from kernels.packed import pack_mxfp4

    base = type(original)
    cls = _dense_classes.setdefault(base, type(f"SuiteKernels{base.__name__}", (base,), {"apply": _dense_apply}))
    method = copy.copy(original)
    method.__class__ = cls
    q, s = quantize_rows(layer.weight.data)
    linear = PackedLinear(pack_mxfp4(q, s), int(threshold))
    _linears[linear.p.words.data_ptr()] = linear
    setattr(method, DENSE_ATTR, (linear, _linear_op()))
    return method


# rows quantized at a time at load: quantize_mxfp4 works in float32 with several temporaries (about 10x the bf16
# rows at its peak, measured on CPU), so gpt-oss' lm_head (201088 x 2880) in one call would take ~11 GiB at load
QUANT_CHUNK_BYTES = 256 << 20


def quantize_rows(w):
    """quantize_mxfp4 of a [N, K] weight, a slice of rows at a time (MX blocks run along K: rows are independent)."""
    import torch

    _import_kernels()
    from kernels.mxfp4 import BLOCK, quantize_mxfp4

    n, k = w.shape
    rows = max(1, QUANT_CHUNK_BYTES // (k * 4))
    if n <= rows:
        return quantize_mxfp4(w.float())
    q = torch.empty((n, k // 2), dtype=torch.uint8, device=w.device)
    s = torch.empty((n, k // BLOCK), dtype=torch.uint8, device=w.device)
    for i in range(0, n, rows):
        q[i:i + rows], s[i:i + rows] = quantize_mxfp4(w[i:i + rows].float())
    return q, s


def free_dense_weight(module) -> None:
    """Drop the BF16 weight once it is quantized (an empty tensor of its dtype keeps attribute lookups working)."""
    import torch

    w = module.weight
    module.weight = torch.nn.Parameter(w.new_empty(0), requires_grad=False)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def install_dense(model, threshold: int) -> list[str]:
    """Swap the quant_method of qkv_proj / o_proj / lm_head modules; returns the names swapped now
    (none when they already were)."""
    found, done = [], []
    for name, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        if qm is None or not DENSE_NAMES.search(name):
            continue
        found.append(name)
        if hasattr(qm, DENSE_ATTR):
            continue
        if type(qm).__name__ not in ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"):
            raise RuntimeError(f"{ENV}=dense: {name} already has {type(qm).__name__}; only BF16 layers are quantized here")
        module.quant_method = dense_method(qm, module, threshold)
        free_dense_weight(module)
        done.append(name)
    if not found:
        raise RuntimeError(f"{ENV}=dense: no qkv_proj / o_proj / lm_head module found in {type(model).__name__}")
    return done


def router_logits(x, weight, bias, threshold: int):
    """What the router module returns once the plugin took it over: vLLM's GEMM above the threshold; at or below
    it an unfilled [M, E] tensor, since the MoE routes those batches from x itself (`route_for_batch`)."""
    import torch

    if x.shape[0] <= threshold:
        return x.new_empty((x.shape[0], weight.shape[0]))
    return torch.nn.functional.linear(x, weight, bias)


def _router_op():
    """`torch.ops.suite_kernels.router_logits`: opaque to torch.compile, so that the batch-size branch is taken at
    run time (vLLM compiles one graph for every batch size)."""
    import torch

    if hasattr(torch.ops, "suite_kernels") and hasattr(torch.ops.suite_kernels, "router_logits"):
        return torch.ops.suite_kernels.router_logits

    @torch.library.custom_op("suite_kernels::router_logits", mutates_args=(), schema=(
        "(Tensor x, Tensor weight, Tensor? bias, SymInt threshold) -> Tensor"))
    def op(x, weight, bias, threshold):
        return router_logits(x, weight, bias, threshold)

    @op.register_fake
    def _(x, weight, bias, threshold):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    return torch.ops.suite_kernels.router_logits


_router_classes: dict[type, type] = {}


def _router_apply(self, layer, x, bias=None):
    import torch

    threshold = getattr(self, ROUTER_ATTR)
    if torch.compiler.is_compiling():
        return _router_op()(x, layer.weight, bias, threshold)
    return router_logits(x, layer.weight, bias, threshold)


def install_route(model, threshold: int) -> int:
    """For every gpt-oss MLP block (a module with `router` and `experts`) whose experts the plugin packed: link the
    router's weight and bias to the packed MoE layer and swap the router's method for `_router_apply`, both or
    neither. Returns the number of blocks linked; a block it cannot link keeps vLLM's router and logits."""
    linked = 0
    for _, block in model.named_modules():
        router, experts = getattr(block, "router", None), getattr(block, "experts", None)
        qm = getattr(router, "quant_method", None)
        if qm is None or experts is None or not hasattr(experts, "modules"):
            continue
        if hasattr(qm, ROUTER_ATTR):
            linked += 1
            continue
        packed = [m for m in experts.modules() if hasattr(m, MOE_ATTR)]
        unquantized = type(qm).__name__ == "UnquantizedLinearMethod"
        if len(packed) != 1 or not unquantized or getattr(router, "weight", None) is None:
            continue
        setattr(packed[0], ROUTER_ATTR, (router.weight, getattr(router, "bias", None)))
        base = type(qm)
        cls = _router_classes.setdefault(base, type(f"SuiteKernelsRouter{base.__name__}", (base,),
                                                    {"apply": _router_apply}))
        method = copy.copy(qm)
        method.__class__ = cls
        setattr(method, ROUTER_ATTR, int(threshold))
        _router_op()  # registered at load, before torch.compile traces the model or loads a cached graph naming it
        router.quant_method = method
        linked += 1
    return linked


def install_route_or_fail(model, threshold: int) -> int:
    """install_route, where the fused route was asked for: a model none of whose blocks could be linked is an error
    (one line), not a silent run of vLLM's router that the results would credit to the fused route."""
    n = install_route(model, threshold)
    if n == 0:
        raise RuntimeError(f"{ROUTE_ENV}=fused: no MoE block of this model has both a packed experts layer and a "
                           f"router with vLLM's unquantized linear method to take over; unset {ROUTE_ENV}")
    return n


def _patch_load(parts: set[str]) -> None:
    """After vLLM loads the served model: the MoE blocks' routers (moe with SUITE_KERNELS_ROUTE=fused), the dense
    layers (dense)."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(BaseModelLoader.load_model, _MARK + "_load", False):
        return
    original = BaseModelLoader.load_model

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        prefix = kwargs.get("prefix", args[2] if len(args) > 2 else "")
        if not prefix:  # the served model, not a speculative drafter
            require_cuda_kernels()
            threshold = load_threshold()
            if "moe" in parts and route() == "fused":
                n = install_route_or_fail(model, threshold)
                print(f"suite_kernels: {n} MoE blocks route from x for M <= {threshold} (vLLM's router GEMM skipped "
                      f"there)", file=sys.stderr, flush=True)
            if "dense" in parts:
                done = install_dense(model, threshold)
                print(f"suite_kernels: dense MXFP4 for {len(done)} modules ({', '.join(done[:3])}"
                      f"{', ...' if len(done) > 3 else ''})", file=sys.stderr, flush=True)
        return model

    setattr(load_model, _MARK + "_load", True)
    BaseModelLoader.load_model = load_model


def register() -> None:
    """vLLM general-plugin entry point (called in every vLLM process, its API server included; idempotent). No CUDA
    here: the threshold's tuning lookup asks the device, so it is read where the weights load (a CUDA context in
    the API server would cost the plugin configs memory stock does not spend, and make vLLM spawn its workers)."""
    parts = check_env()  # a typo, a bad threshold, a fused route without the MoE: fails here, before the weights load
    if not parts:
        return
    if "moe" in parts:
        from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod

        patch_moe(GptOssMxfp4MoEMethod)
    if "dense" in parts or route() == "fused":
        _patch_load(parts)
