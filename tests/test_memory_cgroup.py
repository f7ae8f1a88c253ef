"""A MoE model four times larger than the memory it is given, for real: the firmware (not the test, not
the CLI) runs in a cgroup-v1 memory cgroup limited to a quarter of its weight image, page cache
included, and decodes under a budget that fits the limit with the same bits as without a limit and as
the NumPy reference; the whole image read into memory (the path before mapping) is killed there."""

import os
from pathlib import Path

import pytest

from conftest import REPO
from generator.compile.cache_plan import cache_plan
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, cache_stats
from generator.errors import ColibriError
from generator.verify import compare, reference_run

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
# Mixtral-shaped: 4 layers of 32 experts (top-2), 256 wide: a 54 MB q8_0 image, nearly all experts.
MANY_EXPERTS = ("MixtralConfig", "MixtralForCausalLM", dict(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, num_local_experts=32, num_experts_per_tok=2,
    tie_word_embeddings=False))

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.procs").exists(),
                                reason="needs root and the cgroup-v1 memory controller")


@pytest.fixture
def cgroup():
    """A fresh memory cgroup; removed afterwards (its processes have exited by then)."""
    path = CGROUP_ROOT / f"colibri-test-{os.getpid()}"
    path.mkdir()
    yield path
    path.rmdir()


@pytest.fixture(scope="module")
def big_moe(tmp_path_factory, builder):
    from models import make_checkpoint

    model = make_checkpoint(MANY_EXPERTS, tmp_path_factory.mktemp("cgroup") / "mixtral-32x", dtype="bfloat16")
    return builder.build(model, "q8_0", 64)


def test_a_moe_model_four_times_the_memory_limit_decodes_the_same_bits(big_moe, cgroup, monkeypatch):
    board, art, plan = big_moe
    image = art.weights.stat().st_size
    limit = image // 4
    (cgroup / "memory.limit_in_bytes").write_text(str(limit))
    assert image >= 4 * limit and image > 50e6
    request = RunRequest([1, 17, 99, 3, 250], 32, stop_at_eos=False)
    unlimited = run_on_board(board, art.program, art.weights, request, art.model_hash())  # no cgroup

    # The budget leaves 2 MiB of the limit for what the plan does not count (page tables, the dd).
    budget = limit - 2 * 2**20
    cache = cache_plan(plan, board.budget_reserve, budget)
    assert 2 <= cache.slots < cache.constants.max_slots // 4, "the pool holds a small share of the experts"
    monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", f"{REPO / 'tools' / 'in-memory-cgroup'} {cgroup.name}")
    limited = run_on_board(board, art.program, art.weights,
                           RunRequest(request.prompt, request.steps, stop_at_eos=False, memory_budget=budget),
                           art.model_hash())
    ref = reference_run(plan, art.weights, request)
    assert compare(limited, ref).passed and compare(unlimited, ref).passed
    assert limited.digests == unlimited.digests and limited.expert_counts == unlimited.expert_counts
    stats = cache_stats(limited)
    assert stats["slots"] == cache.slots and stats["cache_misses"] > 0 and not stats["lock_refused"]
    # It ran in the group: the group saw its pages (resident weights, slots), and never more than the limit.
    peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
    assert cache.constants.resident_bytes < peak <= limit

    # The whole image read into memory, as the firmware did before it mapped it, cannot run there.
    copying = RunRequest(request.prompt, request.steps, stop_at_eos=False, copy_weights=True)
    with pytest.raises(ColibriError, match=r"killed by signal 9 \(SIGKILL\)"):
        run_on_board(board, art.program, art.weights, copying, art.model_hash())
