"""Mapped weights and the expert cache under a memory budget (Linux boards): the firmware sizes its
slots exactly as the Python plan does, decodes the same bits at any budget (tokens, per-step logits
hashes, routing counts equal to the unlimited run's and the reference's) while really evicting, and
checks each expert against its CRC-32 when it first brings it in."""

import pytest
from cli_runs import main_json
from conftest import TESTS
from damaged_images import entry, tensor_edited

from generator.compile.cache_plan import cache_plan, parse_size, slots_for_budget
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, cache_stats
from generator.errors import ColibriError
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # MoE builds run under memory budgets on several boards

PROMPT = [1, 5, 9, 33, 7, 12]
STEPS = 24
MOE_MODELS = ("mixtral_moe", "qwen2_moe_shared", "qwen3_moe")


def run(board, art, budget=0, threads=1, prefetch=None, weights=None, prompt=PROMPT, steps=STEPS, eviction=None):
    request = RunRequest(
        prompt, steps, threads=threads, memory_budget=budget, prefetch=prefetch, eviction=eviction, stop_at_eos=False
    )
    return request, run_on_board(board, art.program, weights or art.weights, request, art.model_hash())


def constants(board, plan):
    return cache_plan(plan, board.budget_reserve, 0).constants


def test_sizes_parse_as_the_cli_takes_them():
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("6G") == 6 * 2**30
    assert parse_size("1.5G") == 3 * 2**29
    assert parse_size("123456") == 123456
    assert parse_size("0") == parse_size("unlimited") == 0
    for bad in ("", "12X", "-1M", "M"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_firmware_sizes_its_slots_as_the_plan_does(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    c = constants(board, plan)
    assert c.n_moe_layers == 2 and c.slot_bytes % 4096 == 0 and c.slot_bytes >= c.expert_bytes + 4096 - 64
    k = c.experts_per_token
    for budget, slots in (
        (c.min_budget, k),
        (c.budget_for(k + 1) - 1, k),
        (c.budget_for(k + 1), k + 1),
        (2**40, c.n_moe_layers * c.n_experts),
    ):
        assert slots_for_budget(c, budget) == slots
        _, result = run(board, art, budget)
        assert int(result.stats["slots"]) == slots, budget
        assert int(result.stats["budget"]) == budget


def test_a_budget_too_small_is_refused_before_running_with_the_numbers(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("mixtral_moe"), "q8_0", 64)
    c = constants(board, plan)
    with pytest.raises(
        ColibriError,
        match=rf"too small .* needs at least {c.min_budget:,} B .*resident weights "
        rf"{c.resident_bytes:,} B .* 2 expert slots .* x {c.slot_bytes:,} B",
    ):
        cache_plan(plan, board.budget_reserve, c.min_budget - 1)
    # The firmware refuses it too, from its own constants, should anything skip the check.
    with pytest.raises(ColibriError, match=r"error 102: --memory-budget .* cannot hold this model"):
        run(board, art, c.min_budget - 1)


@pytest.mark.parametrize("model", MOE_MODELS)
def test_same_bits_at_any_budget_on_host(builder, checkpoints, model):
    board, art, plan = builder.build(checkpoints(model), "q8_0", 64)
    c = constants(board, plan)
    request, unlimited = run(board, art)
    ref = reference_run(plan, art.weights, request)
    assert compare(unlimited, ref).passed
    assert cache_stats(unlimited).slots == 0 and cache_stats(unlimited).read_bytes == 0
    # top-k slots in all (every layer evicts the one before), and top-k per MoE layer.
    for budget in (c.min_budget, c.budget_for(c.experts_per_token * c.n_moe_layers)):
        for threads in (1, 2):
            for prefetch, eviction in ((True, "lfu"), (False, "lru"), (True, "lru"), (None, None)):
                _, result = run(board, art, budget, threads, prefetch, eviction=eviction)
                assert result.tokens == unlimited.tokens and result.digests == unlimited.digests
                assert result.expert_counts == unlimited.expert_counts == ref.expert_counts
                assert compare(result, ref).passed
                stats = cache_stats(result)
                # Fewer slots than experts: experts were evicted and read again while decoding.
                assert stats.slots < c.max_slots and stats.cache_misses > 0 and stats.read_bytes > 0
                # Left to itself (None), the firmware picks by the pool's size: top-k slots per MoE
                # layer or more, LRU, else LFU; no prefetching.
                roomy = stats.slots >= c.experts_per_token * c.n_moe_layers
                assert stats.prefetch == int(bool(prefetch))
                assert stats.lru == int(eviction == "lru" if eviction is not None else roomy)
                # A guess needs a next MoE layer (qwen2_moe_shared has one) and a slot that does not
                # hold this token's experts (with top-k slots in all, none is free).
                assert (stats.prefetches > 0) == bool(
                    stats.prefetch and c.n_moe_layers > 1 and stats.slots > c.experts_per_token
                )


@pytest.mark.parametrize("quant", ["q4_0", "q4_1"])
def test_4_bit_experts_read_into_slots_decode_the_same_bits(builder, checkpoints, quant):
    # A slot's matrices point at its copy of the expert: scales, and for q4_1 the minimums too.
    board, art, plan = builder.build(checkpoints("mixtral_moe"), quant, 64)
    request, unlimited = run(board, art)
    assert compare(unlimited, reference_run(plan, art.weights, request)).passed
    _, result = run(board, art, constants(board, plan).min_budget)
    assert cache_stats(result).cache_misses > 0
    assert result.tokens == unlimited.tokens and result.digests == unlimited.digests


def test_same_bits_at_the_smallest_budget_on_linux_aarch64(builder, checkpoints):
    for model in ("mixtral_moe", "qwen3_moe"):
        board, art, plan = builder.build(checkpoints(model), "q8_0", 64, "linux-aarch64")
        c = constants(board, plan)
        request, unlimited = run(board, art)
        _, budgeted = run(board, art, c.min_budget, threads=2)
        ref = reference_run(plan, art.weights, request)
        assert compare(unlimited, ref).passed and compare(budgeted, ref).passed
        assert budgeted.digests == unlimited.digests and budgeted.expert_counts == unlimited.expert_counts
        assert cache_stats(budgeted).cache_misses > 0


def used_and_unused_expert(result, plan):
    """(layer, expert) of an expert the run used and of one it never used (its tensor index too)."""
    index = {t.name: i for i, t in enumerate(plan.tensors)}
    used = unused = None
    for layer, counts in sorted(result.expert_counts.items()):
        for e, n in enumerate(counts):
            if n and used is None:
                used = index[f"layers.{layer}.experts.{e}.w_up"]
            if not n and unused is None:
                unused = index[f"layers.{layer}.experts.{e}.w_up"]
    return used, unused


def test_an_expert_is_checked_when_first_brought_in_not_at_start(builder, checkpoints, tmp_path):
    # qwen3_moe, 8 experts, top-3, 6-token prompt: some expert goes unused, some is used.
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    c = constants(board, plan)
    _, clean = run(board, art, prompt=PROMPT[:2], steps=2)
    used, unused = used_and_unused_expert(clean, plan)
    assert used is not None and unused is not None
    blob = art.weights.read_bytes()
    for name, index in (("unused", unused), ("used", used)):
        path = tmp_path / f"{name}.img"
        path.write_bytes(tensor_edited(blob, index, entry(blob, index)[4] // 2, fix_directory=False))
        for budget in (0, c.min_budget):
            if name == "unused":
                # Start-up checked the header, the directory and the resident tensors only: an expert
                # nobody uses is never read, so its damage costs nothing.
                _, result = run(board, art, budget, weights=path, prompt=PROMPT[:2], steps=2)
                assert result.digests == clean.digests
            else:
                # The loader's code and message, in an error frame, before any wrong number.
                tokens = []
                request = RunRequest(PROMPT[:2], 2, memory_budget=budget, stop_at_eos=False)
                with pytest.raises(ColibriError, match=r"error 17: weight image tensor data is corrupted"):
                    run_on_board(
                        board,
                        art.program,
                        path,
                        request,
                        art.model_hash(),
                        on_token=lambda step, token: tokens.append(token),
                    )
                assert tokens == [], "no token may come from a corrupted expert"


def test_mcu_boards_check_every_expert_at_start(builder, checkpoints, tmp_path):
    # qemu-rv32 reads its weights in place from flash: a damaged expert is refused before hello
    # even if no token would route to it.
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64, "qemu-rv32")
    host_board, host_art, _ = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    _, clean = run(host_board, host_art, prompt=PROMPT[:2], steps=2)
    _, unused = used_and_unused_expert(clean, plan)
    blob = art.weights.read_bytes()
    path = tmp_path / "unused.img"
    path.write_bytes(tensor_edited(blob, unused, 3, fix_directory=False))
    with pytest.raises(ColibriError, match=r"firmware reported error 17:"):
        run_on_board(board, art.program, art.weights, RunRequest(PROMPT[:2], 2), art.model_hash(), flash_image=path)


def test_memory_budget_is_refused_on_mcu_boards(builder, checkpoints):
    from generator.cli import main

    assert main(["run", "--board", "qemu-rv32", "--memory-budget", "1G", "--prompt-ids", "1"]) == 2


def test_cli_refuses_a_budget_too_small_or_malformed_before_building(checkpoints, tmp_path, capsys):
    from generator.cli import main

    model = checkpoints("mixtral_moe")
    capsys.readouterr()
    out = tmp_path / "out"
    base = ["verify", "--model", str(model), "--ctx", "64", "--prompt-ids", "1,2", "--steps", "4", "--out", str(out)]
    assert main([*base, "--memory-budget", "1M"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too small for mixtral_moe" in err[0] and "needs at least" in err[0]
    assert not out.exists(), "nothing built for a refused budget"
    with pytest.raises(SystemExit) as e:
        main([*base, "--memory-budget", "12X"])
    assert e.value.code == 2 and "expected a size such as 512M" in capsys.readouterr().err


def test_report_and_bench_show_the_cache(builder, checkpoints, tmp_path, capsys):
    model = checkpoints("qwen3_moe")
    board, art, plan = builder.build(model, "q8_0", 64)
    c = constants(board, plan)
    budget = c.budget_for(c.experts_per_token * c.n_moe_layers)
    out = tmp_path / "out"
    rep = main_json(capsys, "report", model=model, ctx=64, out=out, memory_budget=budget)["memory_budget"]
    assert rep["resident_bytes"] == c.resident_bytes and rep["slot_bytes"] == c.slot_bytes
    assert rep["slots"] == c.experts_per_token * c.n_moe_layers and rep["slots_per_layer"] == c.experts_per_token
    assert rep["bytes_read_per_token"]["0"] == c.n_moe_layers * c.experts_per_token * c.slot_bytes
    out_json = main_json(capsys, "bench", model=model, ctx=64, out=out, repeat=1, steps=16, memory_budget=budget)
    cache = out_json["cache"]
    assert cache["slots"] == rep["slots"] and 0 <= cache["hit_rate"] <= 1 and cache["read_bytes_per_token"] > 0
    assert cache["storage_read_bytes_s"] > 0 and cache["storage_bound_tok_s"] > 0
    assert out_json["read_bandwidth_bytes_s"] is None, "no memory probe under a budget"
    # No tokenizer to read a text with: the stream is sampled decoding, at the fixed seed.
    assert out_json["stream"]["kind"] == "sampled" and out_json["stream"]["sampling"]["seed"] == 0


def test_a_refused_mlock_is_said_plainly_and_changes_no_bit(builder, checkpoints, monkeypatch):
    import os
    import shutil

    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("needs root, setpriv and prlimit to take CAP_IPC_LOCK away")
    from generator.verify import budget_text, run_stats

    board, art, plan = builder.build(checkpoints("mixtral_moe"), "q8_0", 64)
    c = constants(board, plan)
    _, locked = run(board, art, c.min_budget)
    assert cache_stats(locked).lock_refused == 0 and cache_stats(locked).locked >= c.resident_bytes
    # 64 KiB of RLIMIT_MEMLOCK and no CAP_IPC_LOCK: what an unprivileged user on many distributions has.
    monkeypatch.setenv(
        "COLIBRI_FIRMWARE_PREFIX",
        "prlimit --memlock=65536:65536 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock --",
    )
    request, refused = run(board, art, c.min_budget)
    assert cache_stats(refused).lock_refused == 1
    assert "resident weights NOT locked (mlock refused)" in budget_text(run_stats(refused, board, request))
    assert refused.digests == locked.digests and refused.expert_counts == locked.expert_counts


# ---- Reads in flight together (issue 23 item 3): a layer's misses are all queued at once, each expert
# is computed as soon as its read lands, and the MoE output is still summed in rank order. tests/slow_reads.c,
# preloaded into the firmware, makes the expert reads slow (or slow in a scrambled order, or failing) so
# that these are behaviours to assert, not timings to hope for.

SLOW_US = 20000


@pytest.fixture(scope="session")
def slow_reads(tmp_path_factory):
    """The LD_PRELOAD shim, built for this host."""
    import subprocess

    so = tmp_path_factory.mktemp("shim") / "slow_reads.so"
    src = TESTS / "slow_reads.c"
    subprocess.run(
        ["gcc", "-std=c11", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True
    )
    return so


def shim_prefix(so, **settings):
    """COLIBRI_FIRMWARE_PREFIX that runs the firmware with the shim and its COLIBRI_SLOW_* settings."""
    # 4097: the expert reads, not the 4 KiB O_DIRECT probe at open.
    names = " ".join(f"COLIBRI_SLOW_{k.upper()}={v}" for k, v in {"min_bytes": 4097, **settings}.items())
    return f"env LD_PRELOAD={so} {names}"


def test_a_layers_misses_are_read_together_while_the_experts_compute(builder, checkpoints, slow_reads, monkeypatch):
    # qwen3_moe: top-3, 2 MoE layers; at the smallest budget (3 slots) each layer evicts the other's
    # experts, so every use is a miss and each layer reads 3 experts.
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    c = constants(board, plan)
    k = c.experts_per_token
    assert k == 3
    _, unlimited = run(board, art, steps=8)
    monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", shim_prefix(slow_reads, us=SLOW_US))
    for threads in (1, 2):
        _, result = run(board, art, c.min_budget, threads, prefetch=False, steps=8)
        assert result.digests == unlimited.digests and result.expert_counts == unlimited.expert_counts
        s = cache_stats(result)
        assert s.cache_hits == 0 and s.cache_misses == int(result.stats["decode"]) * c.n_moe_layers * k
        # The shim did slow every read (else this test would measure nothing).
        assert s.read_time_us >= s.cache_misses * SLOW_US
        # All of a layer's misses were queued or under way at once (before: at most two) ...
        assert s.reads_in_flight >= k
        # ... and read side by side: the forward pass waited a fraction of the reads' time
        # (one after another it would wait all of it; two at a time two thirds).
        assert s.read_wait_us < s.read_time_us / 2, s


@pytest.mark.parametrize("model", MOE_MODELS)
def test_reads_that_finish_out_of_order_give_the_same_bits(builder, checkpoints, slow_reads, monkeypatch, model):
    # Each read is slowed by 1 to 4 x 2 ms by its file offset: a layer's experts are computed in the
    # order their reads finish, which is often not their rank; their sum must not notice. f32: no q8_0
    # activations to round a last-bit difference away (with q8_0, summing top-3 experts in the order
    # their reads finish changed few of the logits hashes; in f32 every one).
    board, art, plan = builder.build(checkpoints(model), "f32", 64)
    c = constants(board, plan)
    request, unlimited = run(board, art, steps=12)
    ref = reference_run(plan, art.weights, request)
    reordered = 0
    # On a loaded machine the reads can still finish in rank order throughout: then once more with
    # the delays spread wider.
    for us in (2000, 6000):
        monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", shim_prefix(slow_reads, us=us, scramble=8))
        for budget in (c.min_budget, c.budget_for(c.experts_per_token * c.n_moe_layers)):
            for threads in (1, 2):
                for prefetch in (False, True):
                    _, result = run(board, art, budget, threads, prefetch, steps=12)
                    assert result.tokens == unlimited.tokens and result.digests == unlimited.digests
                    assert result.expert_counts == unlimited.expert_counts
                    assert compare(result, ref).passed
                    reordered += cache_stats(result).reads_reordered
        if reordered:
            break
    assert reordered > 0, "no expert was computed ahead of a lower rank: the order was never tested"


def run_firmware_directly(program, weights, so, budget, prompt, steps, **settings):
    """The firmware's exit status and frames (run_on_board stops it at its error frame)."""
    import subprocess

    from generator.device.protocol import FrameReader
    from generator.device.session import request_frame

    request = RunRequest(prompt, steps, memory_budget=budget, stop_at_eos=False)
    argv = [*shim_prefix(so, **settings).split(), str(program), "--weights", str(weights), *request.firmware_options()]
    done = subprocess.run(argv, input=request_frame(request), capture_output=True, timeout=120)
    return done.returncode, FrameReader().feed(done.stdout)


@pytest.mark.parametrize("fault", ["fail", "short"])
def test_a_failed_or_short_read_among_several_in_flight_ends_the_run(
    builder, checkpoints, slow_reads, monkeypatch, fault
):
    # Every use misses (3 slots, 2 MoE layers, top-3): reads 4, 5 and 6 are token 0's second layer, in
    # flight together; the 5th fails (EIO) or comes up short (the file seems to end in its middle).
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    c = constants(board, plan)
    status, frames = run_firmware_directly(
        art.program, art.weights, slow_reads, c.min_budget, PROMPT, 4, us=SLOW_US, **{fault: 5}
    )
    assert status == 1 and [f.kind for f in frames] == ["hello", "error"], (status, frames)
    assert frames[-1].fields["code"] == "18"
    # Through the CLI's runner: the loader's message, before any token.
    monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", shim_prefix(slow_reads, us=SLOW_US, **{fault: 5}))
    tokens = []
    with pytest.raises(ColibriError, match=r"error 18: reading an expert from the weight image file failed"):
        run_on_board(
            board,
            art.program,
            art.weights,
            RunRequest(PROMPT, 4, memory_budget=c.min_budget, stop_at_eos=False),
            art.model_hash(),
            on_token=lambda step, token: tokens.append(token),
        )
    assert tokens == []


def test_a_corrupted_expert_among_several_in_flight_ends_the_run(builder, checkpoints, slow_reads, tmp_path):
    # Its CRC-32 is checked on the I/O thread that read it, while the token's other reads are in flight.
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    c = constants(board, plan)
    _, clean = run(board, art, prompt=PROMPT[:2], steps=2)
    used, _ = used_and_unused_expert(clean, plan)
    blob = art.weights.read_bytes()
    damaged = tmp_path / "damaged.img"
    damaged.write_bytes(tensor_edited(blob, used, entry(blob, used)[4] // 2, fix_directory=False))
    status, frames = run_firmware_directly(art.program, damaged, slow_reads, c.min_budget, PROMPT[:2], 2, us=SLOW_US)
    assert status == 1 and [f.kind for f in frames] == ["hello", "error"], (status, frames)
    assert frames[-1].fields["code"] == "17" and "corrupted" in frames[-1].fields["msg"]
