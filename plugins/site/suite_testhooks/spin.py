"""GPU side of the slowdown hook: a Triton `%globaltimer` spin kernel whose duration is read at run time.

The kernel waits `a_ns + b_ps x ntok / 1000` nanoseconds of the GPU's global timer (independent of the
SM clock). a and b live in a device tensor, so a kernel captured in a CUDA graph at startup spins for
whatever the tensor holds when the graph is replayed; `ntok` (tokens in the batch) is a launch argument,
fixed per captured graph size, which is right: each graph serves one padded batch size.
Imported only in a CUDA worker (never at plugin registration).

`python -m suite_testhooks.spin` checks the mechanism on a GPU: eager and graph-captured spins, and a
change of the device tensor after capture seen by the replay.
"""
from __future__ import annotations

import time

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["ntok"])
def _spin(params_ptr, ntok):
    a_ns = tl.load(params_ptr)
    b_ps = tl.load(params_ptr + 1)
    ns = a_ns + (b_ps * ntok) // 1000
    z = tl.zeros([1], dtype=tl.int32)
    t0 = tl.max(tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [z], dtype=tl.int64,
                                          is_pure=False, pack=1), 0)
    t = t0
    while t - t0 < ns:
        t = tl.max(tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [z], dtype=tl.int64,
                                             is_pure=False, pack=1), 0)


def launch(params: torch.Tensor, ntok: int) -> None:
    _spin[(1,)](params, int(ntok), num_warps=1)


class GpuDelay:
    mode = "gpu %globaltimer spin after the top-level forward (stream-ordered; captured in CUDA graphs)"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.params = torch.zeros(2, dtype=torch.int64, device=device)  # [a_ns, b_ps per token]
        self.staging = torch.zeros(2, dtype=torch.int64).pin_memory()
        self.stream = torch.cuda.Stream(device=device)
        self.last_capture = 0.0
        launch(self.params, 3)  # JIT-compile now, never during a graph capture
        torch.cuda.synchronize(device)

    def after(self, ntok: int) -> None:
        if torch.cuda.is_current_stream_capturing():
            self.last_capture = time.monotonic()
        launch(self.params, ntok)

    def wait_until_safe(self, quiet_s: float) -> None:
        while time.monotonic() - self.last_capture < quiet_s:
            time.sleep(0.05)

    def set(self, a_ns: int, b_ps: int) -> None:
        with torch.cuda.device(self.device):
            self.staging[0] = int(a_ns)
            self.staging[1] = int(b_ps)
            with torch.cuda.stream(self.stream):
                self.params.copy_(self.staging, non_blocking=True)
            self.stream.synchronize()


def _time_ms(fn, n: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def selftest() -> dict:
    """Eager and captured spins against their requested durations; printed and returned."""
    dev = torch.device("cuda", torch.cuda.current_device())
    d = GpuDelay(dev)
    out = {}
    for a_us, b_ns, ntok in ((0, 0, 1), (200, 0, 1), (0, 100, 2048), (500, 50, 16)):
        d.set(a_us * 1000, b_ns * 1000)
        want = a_us + b_ns * ntok / 1000
        out[f"eager a={a_us}us b={b_ns}ns/tok n={ntok}"] = (want, _time_ms(lambda: launch(d.params, ntok)) * 1000)
    d.set(0, 0)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            d.after(1)
    torch.cuda.current_stream().wait_stream(s)
    for a_us in (0, 100, 500, 0):
        d.set(a_us * 1000, 0)
        out[f"graph replay a={a_us}us (set after capture)"] = (a_us, _time_ms(g.replay) * 1000)
    for k, (want, got) in out.items():
        print(f"{k:45s} requested {want:8.1f} us  measured {got:8.1f} us")
    return out


if __name__ == "__main__":
    res = selftest()
    # never shorter than asked; longer by at most 5% + launch overhead (eager Triton launches are CPU-bound)
    bad = [k for k, (w, g) in res.items() if not (w - 1 <= g <= w * 1.05 + (30 if k.startswith("eager") else 10))]
    print("spin selftest:", "FAILED " + ", ".join(bad) if bad else "ok")
    raise SystemExit(1 if bad else 0)
