"""Exact speculative decoding (firmware_src/app/speculate.c): drafts looked up in the context and
checked in one forward pass give the tokens, the per-step logits and the sampler's draws of plain
decoding, bit for bit, greedy and sampled, at any thread count and on every board that has it;
where it could not keep those bits (experts, DeltaNet layers, short sliding windows, MCU boards)
the plan has no room for it and the firmware decodes plainly."""

import json
from dataclasses import replace

import pytest
from conftest import REPO, run_cli

from generator import job
from generator.boards import load_board
from generator.compile.plan import make_plan, plan_for_board
from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.job import JobOptions
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, rates, reference_run, run_stats

KJV = REPO / "models" / "kjv-tiny"
# A prompt that repeats itself, so that prompt lookup finds drafts that decoding takes.
REPEATING = [1, 45, 96, 30, 12, 45, 96, 30, 12, 45, 96, 30, 12, 45, 96]
SAMPLED = SamplingParams(0.5, top_k=40, top_p=0.95, seed=5)  # see the last test


def run(board, art, prompt, steps, sampling=SamplingParams(), speculate=0, threads=1):
    request = RunRequest(list(prompt), steps, sampling, stop_at_eos=False, threads=threads, speculate=speculate)
    return request, run_on_board(board, art.program, art.weights, request, art.model_hash())


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("threads", [1, 2])
def test_speculative_decoding_gives_plain_decodings_bits(builder, sampling, threads):
    board, art, plan = builder.build(KJV, "q8_0", 128)
    assert plan.speculate_tokens == 8
    _, plain = run(board, art, REPEATING, 60, sampling, threads=threads)
    request, fast = run(board, art, REPEATING, 60, sampling, speculate=7, threads=threads)
    assert fast.tokens == plain.tokens and fast.digests == plain.digests
    assert compare(fast, reference_run(plan, art.weights, request)).passed
    speculation = rates(fast).speculation
    assert speculation is not None and speculation["drafted"] > 0
    # Every token past the first came from a pass or from a drafted token that was taken.
    assert rates(fast).decode_forward_passes + speculation["accepted"] == len(fast.tokens) - 1


def test_drafts_that_decoding_takes_save_forward_passes(builder):
    board, art, _ = builder.build(KJV, "q8_0", 128)
    _, plain = run(board, art, REPEATING, 60)
    _, fast = run(board, art, REPEATING, 60, speculate=7)
    speculation = rates(fast).speculation
    assert speculation["accepted"] > 0 and speculation["tokens_per_pass"] > 1.0
    assert rates(fast).decode_forward_passes < rates(plain).decode_forward_passes == 59


def test_every_draft_length_up_to_the_pass_gives_the_same_bits(builder):
    board, art, _ = builder.build(KJV, "q8_0", 128)
    _, plain = run(board, art, REPEATING, 40, SAMPLED)
    for k in (1, 2, 3, 5, 7, 30):  # 30: more than a pass holds, checked 7 at a time
        _, fast = run(board, art, REPEATING, 40, SAMPLED, speculate=k)
        assert fast.tokens == plain.tokens and fast.digests == plain.digests, k


def test_a_conversation_continued_after_a_speculative_turn_decodes_as_a_plain_one(builder):
    """Rejected drafts leave keys and values past the held positions; the next turn overwrites
    them before any token attends to them."""
    from generator.device.links import open_link

    board, art, _ = builder.build(KJV, "q8_0", 128)
    outcomes = []
    for speculate in (0, 7):
        with open_link(board, art.program, art.weights, art.model_hash(), keep_open=True) as link:
            first = link.turn(RunRequest(REPEATING, 20, stop_at_eos=False, speculate=speculate))
            second = link.turn(RunRequest([7, 45, 96], 20, stop_at_eos=False, start=first.held, speculate=speculate))
        outcomes.append((first.tokens, first.digests, second.tokens, second.digests))
    assert outcomes[0] == outcomes[1]


@pytest.mark.slow  # a build for linux-aarch64, run under qemu-aarch64
def test_linux_aarch64_speculates_with_the_same_bits(builder):
    board, art, plan = builder.build(KJV, "q8_0", 128, "linux-aarch64")
    request, fast = run(board, art, REPEATING, 40, SAMPLED, speculate=7, threads=2)
    assert rates(fast).speculation["drafted"] > 0
    assert compare(fast, reference_run(plan, art.weights, request)).passed


def test_plans_that_cannot_keep_the_bits_have_no_room_for_it(checkpoints):
    host = load_board("host")
    dense = load_hf(KJV, load_tensors=False).spec
    assert plan_for_board(dense, host, "q8_0", 64).speculate_tokens == 8
    assert plan_for_board(dense, load_board("qemu-rv32"), "q8_0", 64).speculate_tokens == 0  # MCU: no key
    assert plan_for_board(dense, load_board("esp32p4"), "q8_0", 64).speculate_tokens == 0
    assert make_plan(dense, "host", "q8_0", 64, 64, speculate_tokens=8).speculate_tokens == 8
    assert make_plan(dense, "host", "q8_0", 64, 4, speculate_tokens=8).speculate_tokens == 4  # at most a batch
    for kind in ("mixtral_moe", "qwen3_5_moe", "gpt_oss"):  # experts, DeltaNet, short windows
        spec = load_hf(checkpoints(kind), load_tensors=False).spec
        plan = plan_for_board(spec, host, "q8_0", 64)
        assert plan.speculate_tokens == 0 and "spec_logits" not in {b.name for b in plan.scratch}, kind


def test_a_model_without_room_for_it_decodes_plainly_when_asked(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("mixtral_moe"), "q8_0", 64)
    assert plan.speculate_tokens == 0
    request, result = run(board, art, [1, 5, 9, 5, 9, 5, 9], 16, speculate=7)
    assert rates(result).speculation is None
    assert compare(result, reference_run(plan, art.weights, request)).passed
    # The --json document says it was off and why; not asked for, it says nothing.
    said = run_stats(result, board, request, plan).to_json()["speculation_off"]
    assert said.startswith("speculation is off for this model") and "experts" in said
    assert "speculation_off" not in run_stats(result, board, replace(request, speculate=0), plan).to_json()


@pytest.mark.parametrize(
    "kind, why",
    [
        ("granite_hybrid", "its Mamba-2 layers' state cannot step back"),
        ("qwen3_5_moe", "its Gated DeltaNet layers' state cannot step back"),
    ],
)
def test_asking_a_model_whose_state_cannot_step_back_says_speculation_is_off(kind, why, checkpoints, capsys):
    options = JobOptions(model=checkpoints(kind), prompt_ids="1,5,9", steps=4, speculate=4, quiet=True)
    job.prepare_run(options)
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if "--speculate" in line]
    off = f"speculation is off for this model: {why} over a rejected draft, so it decodes plainly"
    assert said == [f"colibri: warning: --speculate 4: {off}"], lines
    # On the MCU the board is why (it checks no drafts), whatever the model.
    job.prepare_run(replace(options, model=KJV, board="qemu-rv32"))
    assert "speculation is off on qemu-rv32: the board checks no drafts" in capsys.readouterr().err
    # A model and board that speculate, or no --speculate: nothing said.
    job.prepare_run(replace(options, model=KJV))
    job.prepare_run(replace(options, speculate=0))
    assert "--speculate" not in capsys.readouterr().err


@pytest.mark.slow  # one host build of the tiny Granite hybrid (shared with tests/numerics/test_granite_hybrid.py)
def test_run_json_carries_why_speculation_is_off(checkpoints, tmp_path):
    done = run_cli("run", "--model", checkpoints("granite_hybrid"), "--prompt-ids", "1,5,9,5,9", "--steps", "4",
                   "--speculate", "4", "--ctx", "128", "--json", "--out", tmp_path / "g")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)["stats"]["speculation_off"]
    assert said.startswith("speculation is off for this model: its Mamba-2 layers' state cannot step back")
    assert f"colibri: warning: --speculate 4: {said}" in done.stderr


def test_verify_and_bench_take_speculate_and_say_what_it_did(tmp_path):
    done = run_cli("verify", "--prompt-ids", ",".join(map(str, REPEATING)), "--greedy", "--steps", "40",
                   "--speculate", "7", "--ctx", "128", "--json", "--out", tmp_path / "v")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["pass"] and out["stats"]["speculation"]["accepted"] > 0
    bad = run_cli("verify", "--speculate", "65", "--out", tmp_path / "w")
    assert bad.returncode == 2 and "--speculate: expected a count of drafted tokens from 0 to 64" in bad.stderr


def test_the_sampled_runs_here_draw_other_tokens_than_greedy_decoding(builder):
    """SAMPLED is cool enough that the tiny model's output repeats (so drafts are made and checked)
    and warm enough that its draws are not greedy decoding's."""
    board, art, _ = builder.build(KJV, "q8_0", 128)
    _, greedy = run(board, art, REPEATING, 60)
    _, sampled = run(board, art, REPEATING, 60, SAMPLED, speculate=7)
    assert sampled.tokens != greedy.tokens and rates(sampled).speculation["drafted"] > 0
