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
MANY_EXPERTS = (
    "MixtralConfig",
    "MixtralForCausalLM",
    dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_local_experts=32,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    ),
)

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.procs").exists(),
        reason="needs root and the cgroup-v1 memory controller",
    ),
    pytest.mark.slow,  # runs firmware in memory-limited cgroups
]


@pytest.fixture
def cgroup():
    """A fresh memory cgroup; removed afterwards (its processes have exited by then)."""
    path = CGROUP_ROOT / f"colibri-test-{os.getpid()}"
    path.mkdir()
    yield path
    path.rmdir()


@pytest.fixture(scope="module")
def big_moe_model(tmp_path_factory):
    from models import make_checkpoint

    return make_checkpoint(MANY_EXPERTS, tmp_path_factory.mktemp("cgroup") / "mixtral-32x", dtype="bfloat16")


@pytest.fixture(scope="module")
def big_moe(big_moe_model, builder):
    return builder.build(big_moe_model, "q8_0", 64)


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
    limited = run_on_board(
        board,
        art.program,
        art.weights,
        RunRequest(request.prompt, request.steps, stop_at_eos=False, memory_budget=budget),
        art.model_hash(),
    )
    ref = reference_run(plan, art.weights, request)
    assert compare(limited, ref).passed and compare(unlimited, ref).passed
    assert limited.digests == unlimited.digests and limited.expert_counts == unlimited.expert_counts
    stats = cache_stats(limited)
    assert stats.slots == cache.slots and stats.cache_misses > 0 and not stats.lock_refused
    # It ran in the group: the group saw its pages (resident weights, slots), and never more than the limit.
    peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
    assert cache.constants.resident_bytes < peak <= limit

    # The whole image read into memory, as the firmware did before it mapped it, cannot run there.
    copying = RunRequest(request.prompt, request.steps, stop_at_eos=False, copy_weights=True)
    with pytest.raises(ColibriError, match=r"killed by signal 9 \(SIGKILL\)"):
        run_on_board(board, art.program, art.weights, copying, art.model_hash())


def test_auto_takes_the_cgroup_limit_less_the_margin_and_decodes_the_same_bits(
    big_moe, big_moe_model, cgroup, monkeypatch, tmp_path
):
    """--memory-budget auto, end to end: the CLI cannot see the firmware's cgroup (it runs outside
    it), so the firmware resolves auto where it runs, and verify passes with its numbers."""
    import json

    from cli_runs import cli_options, verify_passes
    from conftest import run_cli

    from generator.compile.cache_plan import AUTO_MARGIN_BYTES, AutoBudget, slots_for_budget

    board, art, plan = big_moe
    image = art.weights.stat().st_size
    (cgroup / "memory.limit_in_bytes").write_text(str(image // 4 - 2 * 2**20 + AUTO_MARGIN_BYTES))
    limit = int((cgroup / "memory.limit_in_bytes").read_text())  # the kernel keeps whole pages of it
    budget = limit - AUTO_MARGIN_BYTES  # as above: about a quarter of the image, a small share of the experts
    c = cache_plan(plan, board.budget_reserve, budget).constants
    slots = slots_for_budget(c, budget)
    assert 2 <= slots < c.max_slots // 4
    request = RunRequest([1, 17, 99, 3, 250], 32, stop_at_eos=False)
    unlimited = run_on_board(board, art.program, art.weights, request, art.model_hash())  # no cgroup
    monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", f"{REPO / 'tools' / 'in-memory-cgroup'} {cgroup.name}")
    auto = run_on_board(
        board,
        art.program,
        art.weights,
        RunRequest(request.prompt, request.steps, stop_at_eos=False, memory_budget=AutoBudget()),
        art.model_hash(),
    )
    stats = cache_stats(auto)
    assert (stats.auto_source, stats.auto_found, stats.auto_margin) == ("cgroup-v1", limit, AUTO_MARGIN_BYTES)
    assert stats.auto_where == f"/sys/fs/cgroup/memory/{cgroup.name}/memory.limit_in_bytes"
    assert stats.budget == budget and stats.slots == slots and stats.cache_misses > 0
    assert auto.digests == unlimited.digests and auto.expert_counts == unlimited.expert_counts
    assert int((cgroup / "memory.max_usage_in_bytes").read_text()) <= limit

    # The CLI, the firmware in the cgroup and the CLI outside: verify's JSON says what the board chose.
    out = art.out_dir
    model = dict(model=big_moe_model, quant="q8_0", ctx=64)
    summary = verify_passes(out, **model, prompt_ids="1,17,99,3,250", steps=8, ignore_eos=True, memory_budget="auto")
    held = summary["stats"]["weights_held"]
    assert summary["pass"] and held["budget"] == budget and held["auto_found"] == limit and held["slots"] == slots
    # An auto-MARGIN that leaves less than the model needs: the firmware's one line, a non-zero exit.
    margin = limit - c.min_budget + 1
    done = run_cli("run", *cli_options(**model, out=out, prompt_ids="1,2", steps=2, memory_budget=f"auto-{margin}"))
    errors = [line for line in done.stderr.splitlines() if line.startswith("colibri: error: ")]
    assert done.returncode != 0 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        f"error 102: --memory-budget auto: cgroup-v1 {limit} B (/sys/fs/cgroup/memory/{cgroup.name}/"
        f"memory.limit_in_bytes) - margin {limit - c.min_budget + 1} B = {c.min_budget - 1} B cannot hold this model"
        in errors[0]
    )

    # report in the cgroup (the CLI itself limited, given a gigabyte for Python): what auto chooses there and why.
    import subprocess
    import sys

    (cgroup / "memory.limit_in_bytes").write_text(str(2**30))
    margin = 2**30 - budget
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((big_moe_model / "config.json").read_bytes())
    report = [
        str(REPO / "tools" / "in-memory-cgroup"),
        cgroup.name,
        sys.executable,
        "-m",
        "generator.cli",
        "report",
        "--model",
        str(config_only),
        "--ctx",
        "64",
        "--memory-budget",
        f"auto-{margin}",
    ]
    done = subprocess.run([*report, "--json"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)["memory_budget"]
    assert rep["budget"] == budget and rep["slots"] == slots
    assert rep["auto"] == {
        "found": 2**30,
        "source": "cgroup-v1",
        "margin": margin,
        "usable": budget,
        "where": f"/sys/fs/cgroup/memory/{cgroup.name}/memory.limit_in_bytes",
        "whole_model": False,
        "why": rep["auto"]["why"],
    }
    text = subprocess.run(report, cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert (
        f"memory budget auto on this machine now: cgroup v1 limit 1.00 GiB (1,073,741,824 B, /sys/fs/cgroup/memory/"
        f"{cgroup.name}/memory.limit_in_bytes) - margin {margin / 2**20:.1f} MiB = {budget / 2**20:.1f} MiB "
        f"({budget:,} B)\n  memory budget {budget:,} B: the firmware keeps"
    ) in text, text
