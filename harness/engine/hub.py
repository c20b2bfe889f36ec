"""Is a hub model id usable here? Checked when the run starts, not after a server failed to boot.

vLLM downloads `org/name` checkpoints itself; offline (the usual state of a GPU box) a model that is
not in the local Hugging Face cache makes the server die after a long boot. The users' GB10 keeps
gpt-oss-120b in its cache, so a cached id passes without any network access.
"""
from __future__ import annotations

import os

from harness.core.errors import SuiteError

HUB = "https://huggingface.co"


def check_hub_model(repo_id: str, timeout_s: float = 5.0) -> str:
    """'cached' or 'hub' when vLLM can get `repo_id`; else SuiteError naming the fix."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return "unchecked"  # no huggingface_hub here: vLLM will say what it finds
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str) and os.path.isfile(cached):
        return "cached"
    fix = (f"download it first (huggingface-cli download {repo_id}), point HF_HOME at a cache that has it, "
           "or pass a local checkpoint directory")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise SuiteError(f"--model {repo_id}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {fix}")
    import requests

    try:
        r = requests.head(f"{HUB}/api/models/{repo_id}", timeout=timeout_s, allow_redirects=True)
    except requests.RequestException as e:
        raise SuiteError(f"--model {repo_id}: not in the local Hugging Face cache and {HUB} is unreachable "
                         f"({type(e).__name__}); {fix}") from None
    if r.status_code == 404:
        raise SuiteError(f"--model {repo_id}: no such model on {HUB}; check the id")
    if r.status_code >= 400:
        raise SuiteError(f"--model {repo_id}: {HUB} answered HTTP {r.status_code} (gated or private?); {fix}")
    return "hub"
