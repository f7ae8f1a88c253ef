"""gpt-oss on the boards: a random-init GptOssForCausalLM (tests/models.py "gpt_oss": sinks,
sliding layers of window 4 and full ones alternating, YaRN, biases everywhere, 8 experts top-4
then softmax, the clamped SwiGLU) decodes the reference's tokens and per-step logits hashes with
q8_0 and q4_0 weights, greedy and sampled, on 1 and 2 threads; under a memory budget (fewer
expert slots than experts) with the same bits as unlimited; and on linux-aarch64 and qemu-rv32."""

import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt

from generator.compile.cache_plan import cache_plan
from generator.device.session import cache_stats
from generator.numerics.sampling import SamplingParams
from generator.verify import reference_run

pytestmark = pytest.mark.slow  # builds the gpt-oss firmware in two quantizations and runs it on three boards

PROMPT = [1, 17, 42, 99, 7, 200]
STEPS = 10  # the sliding layers' window is 4: most steps see a window that has moved on
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=11)


def run(board, art, sampling=SamplingParams(), threads=1, budget=0, steps=STEPS):
    return run_prompt(board, art, PROMPT, steps, sampling, threads, budget)


def assert_verified(plan, art, request, result, ref=None):
    """The run against the reference's decode of the same image (given, or made here)."""
    assert_decodes_as_the_reference(plan, art, request, result, ref)
    passes = len(PROMPT) + request.steps - 1  # every layer routes each pass to 4 experts
    assert set(result.expert_counts) == {0, 1, 2, 3}
    assert all(sum(c) == 4 * passes for c in result.expert_counts.values())


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_gpt_oss_verifies_on_host_greedy_and_sampled_on_1_and_2_threads(quant, builder, checkpoints):
    board, art, plan = builder.build(checkpoints("gpt_oss"), quant, 64)
    assert plan.spec.attn_sinks and plan.spec.expert_biases and plan.kv_slots == (4, 64, 4, 64)
    unlimited = {}
    for sampling in (SamplingParams(), SAMPLED):
        ref = None  # the reference does not depend on the thread count: one decode for both
        for threads in (1, 2):
            request, result = run(board, art, sampling, threads)
            ref = ref or reference_run(plan, art.weights, request)
            assert_verified(plan, art, request, result, ref)
            unlimited[sampling.seed, threads] = result
    assert unlimited[SAMPLED.seed, 1].digests == unlimited[SAMPLED.seed, 2].digests
    # Under the smallest budget (2 threads and the I/O thread): top-k slots for 4 layers of 8
    # experts, evicting all the time.
    c = cache_plan(plan, board.budget_reserve, 0).constants
    request, budgeted = run(board, art, SAMPLED, 2, budget=c.min_budget)
    stats = cache_stats(budgeted)
    assert stats.slots == c.experts_per_token < c.max_slots and stats.cache_misses > 0
    assert budgeted.tokens == unlimited[SAMPLED.seed, 2].tokens
    assert budgeted.digests == unlimited[SAMPLED.seed, 2].digests
    assert budgeted.expert_counts == unlimited[SAMPLED.seed, 2].expert_counts


def test_gpt_oss_verifies_on_linux_aarch64_with_q4_0_on_2_threads_under_a_budget(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("gpt_oss"), "q4_0", 64, "linux-aarch64")
    request, unlimited = run(board, art, SAMPLED, threads=2)
    assert_verified(plan, art, request, unlimited)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    _, budgeted = run(board, art, SAMPLED, threads=2, budget=c.min_budget)
    assert cache_stats(budgeted).cache_misses > 0
    assert budgeted.digests == unlimited.digests and budgeted.expert_counts == unlimited.expert_counts


def test_gpt_oss_verifies_on_qemu_rv32_with_q8_0(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("gpt_oss"), "q8_0", 32, "qemu-rv32")
    request, result = run(board, art, SAMPLED, steps=10)
    assert result.hello["board"] == "qemu-rv32"
    assert_verified(plan, art, request, result)
