"""Level 1.5: profile a short prefill + decode on a running server and check its kernel path."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.suite import RunningServer, Suite
from harness.traces import KernelSummary, PathVerdict, check_path, profile, save_summary

# ~300 prompt tokens then 24 decode steps: enough for every prefill and decode kernel to appear.
WORKLOAD_PROMPT = "import os\nimport sys\n\n" + "def handler(event, context):\n    return {'status': 200, 'body': event}\n\n" * 12


@dataclass
class KernelPath:
    summary: KernelSummary
    verdict: PathVerdict
    artifact: Path


def profile_kernel_path(suite: Suite, server: RunningServer) -> KernelPath:
    client = server.client()

    def workload() -> None:
        client.complete(WORKLOAD_PROMPT, max_tokens=24)
        client.complete("class Config:\n", max_tokens=8)

    kind = "kernel" if suite.platform.is_cuda else "cpu_op"
    summary = profile(server.url, server.trace_dir, workload, kind)
    spec = server.target.spec
    verdict = check_path(summary, spec.kernels, server.log_text())
    artifact = suite.artifact("kernels", f"{suite.model.alias}__{server.target.name}.json")
    save_summary(summary, verdict, artifact, config=server.target.name, model=suite.model.alias,
                 platform=suite.platform.name, device=suite.platform.device, excused=verdict.excused,
                 verification=spec.kernels.verification,
                 expected={"must": spec.kernels.must, "must_not": spec.kernels.must_not, "excuses": spec.kernels.excuses})
    return KernelPath(summary, verdict, artifact)
