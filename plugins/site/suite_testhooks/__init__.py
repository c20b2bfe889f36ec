"""Test-only vLLM hooks of the gpt-oss suite: a memory hold and a forward-pass slowdown.

vLLM finds this package through the `vllm.general_plugins` entry point of the hand-written
`suite_testhooks-0.0.0.dist-info` next to it, once `<repo>/plugins/site` is on the server's PYTHONPATH
(`harness.engine.hooks.server_env`, used by `Suite.boot`). vLLM calls `register()` in every process it starts
(API server, EngineCore, workers), so it is idempotent, cheap and never touches CUDA. Every hook is a
no-op unless its own variable is set:

  SUITE_HOOK_HOLD_GIB=1.5   allocate and touch 1.5 GiB inside `BaseModelLoader.load_model` and keep it:
                            on GPUs vLLM measures it as model weights (its KV cache shrinks to fit), on
                            CPU it is resident memory of the worker.
  SUITE_HOOK_SLOWDOWN=1     after every forward pass of the top-level model, wait a + b x tokens-in-batch:
                            a `%globaltimer` spin kernel on the GPU (stream-ordered, so it is captured in
                            CUDA graphs and replayed with them; it reads a and b from a device tensor at
                            run time), a busy-wait on CPU. a and b come from the control file
                            `$SUITE_HOOK_DIR/slowdown.json` ({"seq": n, "a_us": .., "b_us_per_token": ..}),
                            re-read by a watcher thread, so one server is measured at several slowdowns
                            without a reboot. 0 / 0 until the file says otherwise.
  SUITE_HOOK_ROUTES=FILE    count the experts each MoE layer routes to and write them to FILE once per step
                            (`routes.py`; needs --enforce-eager). Installed after the model is loaded, so it
                            wraps whatever other plugins put on vLLM's MoE method.
  SUITE_HOOK_RANDOM_MXFP4=1 with --load-format dummy: valid random weights (`dummy_mxfp4.py`): random E2M1
                            codes and finite E8M0 scales in the MXFP4 experts (the dummy loader leaves them
                            zero) and a scaled init of the floating-point weights (norms 1, biases 0, matrices
                            N(0, 1/fan_in)); with the dummy loader's +-1e-3 floats the router bias picks the
                            same four experts for every token.
  SUITE_HOOK_DECODE_LOGITS_SCALE=S
                            a decode-only fault (`decode_logits.py`): logits x S in the steps whose forward
                            pass had <= 16 tokens (decode), prefills' logits (first token, prompt logprobs) untouched.
  SUITE_HOOK_DIR=DIR        where the control file is read and the acknowledgements are written:
                            `ack-<pid>.json` says what this process applied (hold, mode, seq, a, b).
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time

from . import decode_logits, dummy_mxfp4, routes

HOLD_ENV = "SUITE_HOOK_HOLD_GIB"
SLOWDOWN_ENV = "SUITE_HOOK_SLOWDOWN"
DIR_ENV = "SUITE_HOOK_DIR"
CONTROL_FILE = "slowdown.json"
POLL_S = 0.02
# The GPU delay is updated from another thread; never while vLLM captures CUDA graphs (a CUDA call from
# another thread can invalidate a capture). Captures happen at startup; this is how long to stay clear.
CAPTURE_QUIET_S = 2.0

_MARK = "_suite_testhooks"
_lock = threading.Lock()
_state: dict = {"hold": None, "held": [], "slowdown": None, "errors": [], "wrapped": 0}


def hold_gib() -> float:
    raw = os.environ.get(HOLD_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        return 0.0


def slowdown_wanted() -> bool:
    return os.environ.get(SLOWDOWN_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def hook_dir() -> str | None:
    return os.environ.get(DIR_ENV) or None


def register() -> None:
    """vLLM general-plugin entry point: patch `BaseModelLoader.load_model` when a hook is wanted."""
    if dummy_mxfp4.random_mxfp4_wanted():
        dummy_mxfp4.install_random_mxfp4()  # before load_model runs: the loader's weights are filled inside it
    if hold_gib() <= 0 and not slowdown_wanted() and not routes.routes_file() and decode_logits.decode_logits_scale() is None:
        return
    from vllm.model_executor.model_loader.base_loader import (
        BaseModelLoader,  # no CUDA here
    )

    if getattr(BaseModelLoader.load_model, _MARK, False):
        return
    original = BaseModelLoader.load_model

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        model_config = kwargs.get("model_config", args[1] if len(args) > 1 else None)
        prefix = kwargs.get("prefix", args[2] if len(args) > 2 else "")
        # the served model only: a drafter (speculative decoding) is loaded through the same method
        if vllm_config is not None and not prefix and model_config is getattr(vllm_config, "model_config", None):
            _after_load(model, vllm_config)
        return model

    setattr(load_model, _MARK, True)
    BaseModelLoader.load_model = load_model


def _after_load(model, vllm_config) -> None:
    with _lock:
        first = _state["hold"] is None and _state["slowdown"] is None
    if not first:
        return
    try:
        gib = hold_gib()
        if gib > 0:
            _hold(gib, vllm_config)
        if slowdown_wanted():
            _install_slowdown(model, vllm_config)
        if routes.routes_file():
            routes.install()
        scale = decode_logits.decode_logits_scale()
        if scale is not None:
            decode_logits.install(scale, tokens_in_batch)
    except BaseException as e:
        _state["errors"].append(f"{type(e).__name__}: {e}")
        write_ack()
        raise
    write_ack()


def _device(vllm_config):
    import torch

    dev = vllm_config.device_config.device
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _hold(gib: float, vllm_config) -> None:
    import torch

    dev = _device(vllm_config)
    n = int(gib * 2**30)
    # torch.ones, not empty/zeros: every page is written, so it is resident (RSS on CPU) and allocated
    t = torch.ones(n, dtype=torch.uint8, device=dev)
    _state["held"].append(t)
    where = ("inside BaseModelLoader.load_model: vLLM counts it as model weights, so its KV cache shrinks"
             if dev.type == "cuda" else "inside BaseModelLoader.load_model: resident memory (RSS) of the worker")
    _state["hold"] = {"gib": gib, "bytes": n, "device": str(dev), "where": where}


# ---------------------------------------------------------------------------------------------- slowdown


def tokens_in_batch(args, kwargs) -> int:
    """Tokens of this forward pass: input_ids (or positions / inputs_embeds) length."""
    x = kwargs.get("input_ids", args[0] if args else None)
    if getattr(x, "shape", None) is not None and len(x.shape) >= 1:
        return int(x.shape[0])
    pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
    if getattr(pos, "shape", None) is not None and len(pos.shape) >= 1:
        return int(pos.shape[-1])
    emb = kwargs.get("inputs_embeds", args[3] if len(args) > 3 else None)
    if getattr(emb, "shape", None) is not None and len(emb.shape) >= 1:
        return int(emb.shape[0])
    return 1


class CpuDelay:
    """Busy-wait (not sleep: the core stays busy, as compute would) of a + b x tokens after each forward."""

    mode = "cpu busy-wait after the top-level forward"

    def __init__(self) -> None:
        self.ab_s = (0.0, 0.0)

    def after(self, ntok: int) -> None:
        a, b = self.ab_s
        d = a + b * ntok
        if d > 0:
            end = time.perf_counter() + d
            while time.perf_counter() < end:
                pass

    def set(self, a_ns: int, b_ps: int) -> None:
        self.ab_s = (a_ns / 1e9, b_ps / 1e12)


def _install_slowdown(model, vllm_config) -> None:
    if getattr(model, _MARK, False):
        return
    dev = _device(vllm_config)
    if dev.type == "cuda":
        from suite_testhooks.spin import GpuDelay

        delay = GpuDelay(dev)
    else:
        delay = CpuDelay()
    original = model.forward  # bound method of the top-level module (outside torch.compile)

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        delay.after(tokens_in_batch(args, kwargs))
        _state["wrapped"] += 1
        return out

    model.forward = forward  # nn.Module.__call__ dispatches to the instance attribute
    setattr(model, _MARK, True)
    info = {"installed": True, "mode": delay.mode, "model_class": type(model).__name__, "device": str(dev),
            "seq": None, "a_us": 0.0, "b_us_per_token": 0.0, "applied_at": None}
    _state["slowdown"] = info
    ctl = control_path()
    if ctl is not None:
        current = read_control(ctl)
        if current is not None:  # a control written before boot: apply now, on this thread, before any capture
            _apply(delay, current, info, from_thread=False)
        threading.Thread(target=_watch, args=(ctl, delay, info), name="suite-testhooks-watch", daemon=True).start()


def control_path() -> str | None:
    d = hook_dir()
    return os.path.join(d, CONTROL_FILE) if d else None


def read_control(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _apply(delay, ctl: dict, info: dict, from_thread: bool) -> None:
    a_us = max(0.0, float(ctl.get("a_us") or 0.0))
    b_us = max(0.0, float(ctl.get("b_us_per_token") or 0.0))
    if from_thread and hasattr(delay, "wait_until_safe"):
        delay.wait_until_safe(CAPTURE_QUIET_S)
    delay.set(int(round(a_us * 1000)), int(round(b_us * 1e6)))
    info.update(seq=ctl.get("seq"), a_us=a_us, b_us_per_token=b_us, applied_at=time.time())


def _watch(path: str, delay, info: dict) -> None:
    last = None
    while True:
        try:
            st = os.stat(path)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = None
        if key is not None and key != last:
            ctl = read_control(path)
            if ctl is not None:
                last = key
                if ctl.get("seq") != info.get("seq"):
                    try:
                        _apply(delay, ctl, info, from_thread=True)
                    except Exception as e:  # report, keep watching
                        _state["errors"].append(f"apply seq {ctl.get('seq')}: {type(e).__name__}: {e}")
                    write_ack()
        time.sleep(POLL_S)


def ack() -> dict:
    return {"pid": os.getpid(), "time": time.time(), "hold": _state["hold"], "slowdown": _state["slowdown"],
            "eager_forward_calls": _state["wrapped"], "errors": list(_state["errors"])}


def write_ack() -> str | None:
    """Write `ack-<pid>.json` atomically under SUITE_HOOK_DIR (what this process applied)."""
    d = hook_dir()
    if not d:
        return None
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"ack-{os.getpid()}.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(ack(), f)
    os.replace(tmp, path)
    return path
