"""DeepSeek-V3's fine-grained routing under a memory budget: 256 routed experts a layer in 8 groups
(4 used), top-8 by sigmoid scores with the correction bias, one shared expert, a dense first layer
and latent attention, at a small width. The expert cache sizes its slots from the top-8 (the least
budget holds one token's 8 experts of one layer), evicts and reads while decoding, and every
budget gives the unlimited run's bits: tokens, per-step logits hashes and the routing of each
layer, on host at 1 and 2 threads and on linux-aarch64."""

import pytest
from test_expert_cache import constants, run

from generator.compile.cache_plan import slots_for_budget
from generator.device.session import cache_stats
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # one host build, one linux-aarch64 build, runs under budgets (about 30 s)

# DeepSeek-V3's routing (256 experts, n_group 8, topk_group 4, top-8) on tests/models.py's
# "deepseek_v3_mla" (hidden 64, experts of 32): 2 MoE layers of 256 experts, a 13 MB checkpoint.
FINE_GRAINED = dict(n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4)
PROMPT = [1, 17, 42, 99, 7, 3, 250, 5]
STEPS = 16


@pytest.fixture(scope="module")
def fine_grained(tmp_path_factory):
    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["deepseek_v3_mla"]
    out = tmp_path_factory.mktemp("deepseek-v3-256") / "model"
    return make_checkpoint((config_cls, model_cls, dict(kwargs, **FINE_GRAINED)), out)


def test_256_experts_top_8_decode_the_same_bits_under_every_budget_on_host(builder, fine_grained):
    board, art, plan = builder.build(fine_grained, "q8_0", 64)
    c = constants(board, plan)
    assert (c.n_moe_layers, c.n_experts, c.experts_per_token) == (2, 256, 8)
    request, unlimited = run(board, art, prompt=PROMPT, steps=STEPS)
    ref = reference_run(plan, art.weights, request)
    assert compare(unlimited, ref).passed
    # The least budget holds one token's experts of one layer; then one more slot; then top-8 per layer.
    k = c.experts_per_token
    for budget, slots in ((c.min_budget, k), (c.budget_for(k + 1), k + 1), (c.budget_for(2 * k), 2 * k)):
        assert slots_for_budget(c, budget) == slots
        for threads in (1, 2):
            _, result = run(board, art, budget, threads, prompt=PROMPT, steps=STEPS)
            stats = cache_stats(result)
            assert stats.slots == slots and stats.cache_misses > 0
            assert result.tokens == unlimited.tokens and result.digests == unlimited.digests
            assert result.expert_counts == unlimited.expert_counts == ref.expert_counts
    # The routing is fine-grained: the prompt and the decode spread over many of each layer's experts.
    assert all(sum(n > 0 for n in counts) > 2 * k for counts in unlimited.expert_counts.values())


def test_256_experts_top_8_at_the_smallest_budget_on_linux_aarch64(builder, fine_grained):
    board, art, plan = builder.build(fine_grained, "q8_0", 64, "linux-aarch64")
    request, unlimited = run(board, art, prompt=PROMPT, steps=STEPS)
    _, budgeted = run(board, art, constants(board, plan).min_budget, threads=2, prompt=PROMPT, steps=STEPS)
    assert compare(unlimited, reference_run(plan, art.weights, request)).passed
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests
    assert budgeted.expert_counts == unlimited.expert_counts and cache_stats(budgeted).cache_misses > 0
