"""One model over several MPI ranks (host-mpi, runtime/ranks/mpi.c): on 2 and 4 ranks of this
machine, a dense, a MoE and a hybrid random-init checkpoint decode the single board's tokens and
per-step logits hashes (the NumPy reference's), greedy and sampled, each rank mapping only its own
weight image; one build per model and rank count, shared by every test; two hosts through a real
sshd on two loopback addresses. And the faults: a rank killed mid-decode, a rank stalled, a host
that cannot be reached, a rank given another rank's image or another build's: one line naming the
rank or host (or the timeout), no hang, no rank left running; --memory-budget per rank."""

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_runs import assert_decodes_as_the_reference, main_json
from damaged_images import tensor_edited

from generator.compile import image_format as fmt
from generator.device.hosts import hosts_for
from generator.device.links import Firmware, LinkOptions
from generator.device.runner import run_firmware
from generator.device.session import RunRequest, RunResult, cache_stats
from generator.errors import ColibriError
from generator.numerics.sampling import SamplingParams

# The dense: per-head q/k norms, 8 query heads over 4 KV groups (its attention split by KV group
# over 2 and 4 ranks); the MoE: 6 experts, top 2, a gated shared expert; the hybrid: LFM2-MoE's
# short convolutions beside attention layers, and its experts (both 2 KV groups: split over 2
# ranks, split by rows over 4).
MODELS = {"dense": "qwen3_qknorm_kv4", "moe": "qwen2_moe_shared", "hybrid": "lfm2_moe"}
PROMPT = [1, 17, 42, 99, 7]  # a batch of five: the gather of a batch's rows too
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, seed=5)
# Builds a dense, a MoE and a hybrid host-mpi firmware (one each, shared by every rank count and fault).
building = pytest.mark.slow


def slots(hosts: str) -> int:
    return sum(int(entry.partition(":")[2] or 1) for entry in hosts.split(","))


def run_ranks(builder, model: Path, hosts: str, request: RunRequest, on_token=None, timeout=None, images=None):
    """A run on `hosts`, the build made for as many ranks as they give, each rank given its own
    image (or `images`)."""
    board, art, plan = builder.build(model, "q8_0", 64, "host-mpi", ranks=slots(hosts))
    firmware = Firmware(art.program, art.weights, art.model_hash(), rank_weights=images or art.rank_weights())
    how = LinkOptions(hosts=hosts_for(board, hosts, None))
    return board, art, plan, run_firmware(board, firmware, how, request, on_token, timeout)


@building
@pytest.mark.parametrize("kind", ["dense", "moe", "hybrid"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_decode_the_single_boards_bits_greedy_and_sampled(kind, ranks, builder, checkpoints):
    for sampling in (SamplingParams(), SAMPLED):
        request = RunRequest(PROMPT, 8, sampling, stop_at_eos=False)
        _, art, plan, result = run_ranks(builder, checkpoints(MODELS[kind]), f"localhost:{ranks}", request)
        assert_decodes_as_the_reference(plan, art, request, result)  # the expert counts too
        assert bool(result.expert_counts) == (kind != "dense")


def directory(path: Path) -> tuple[dict, list[dict]]:
    """An image's header fields and directory entries."""
    blob = path.read_bytes()
    header = fmt.unpack(fmt.HEADER, blob)
    entries = [
        fmt.unpack(fmt.DIR_ENTRY, blob, header["dir_offset"] + i * fmt.DIR_ENTRY_BYTES)
        for i in range(header["tensor_count"])
    ]
    return header, entries


@building
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_image_holds_only_its_share(ranks, builder, checkpoints):
    """The builds the decode test made: every routed expert in exactly one rank's image (e mod N),
    every split matrix's rows once over the ranks, the embedding and norms in every one."""
    _, art, plan = builder.build(checkpoints(MODELS["moe"]), "q8_0", 64, "host-mpi", ranks=ranks)
    whole_header, whole = directory(art.weights)
    images = art.rank_weights()
    assert [p.name for p in images] == [f"weights.rank{r}.img" for r in range(ranks)]
    held = []
    for rank, path in enumerate(images):
        header, entries = directory(path)
        assert (header["rank"], header["ranks"], header["model_hash"]) == (rank, ranks, whole_header["model_hash"])
        assert path.stat().st_size < art.weights.stat().st_size
        held.append({e["name"].rstrip(b"\0").decode(): e for e in entries})
    for entry in whole:
        name = entry["name"].rstrip(b"\0").decode()
        rows = [h[name]["rows"] for h in held]
        if ".experts." in name:
            owner = int(name.split(".experts.")[1].split(".")[0]) % ranks
            assert [r > 0 for r in rows] == [r == owner for r in range(ranks)], name
        elif name in ("embed",) or name.endswith("norm"):
            assert rows == [entry["rows"]] * ranks, name
        elif name.endswith((".wq", ".w_down", "router")):  # split by output rows
            assert sum(rows) == entry["rows"] and max(rows) < entry["rows"], name
            # held once over the ranks: at most each rank's own padding after its quants more
            assert sum(h[name]["bytes"] for h in held) <= entry["bytes"] + ranks * fmt.ALIGN, name


def test_attention_splits_by_kv_group_where_the_groups_go_round_the_ranks(checkpoints):
    """Planned, nothing built: the dense model's 4 KV groups over 3 ranks fall 1, 1 and 2 to the
    ranks (G*r/N), and each rank's image holds the q, k and v rows of its groups' heads, whole heads
    (not the even split of rows, which would cut a head), and its cache keeps 2 groups' heads (the
    most a rank holds: one firmware serves every rank). Where it does not pay or cannot keep the
    bits, a layer keeps the split by rows: fewer groups than ranks, q/k norms over every head's
    queries (OLMoE), latent attention, layers without heads (the hybrid's short convolutions)."""
    from dataclasses import replace

    from generator.boards import load_board
    from generator.compile.layout import kv_group_split, rank_images
    from generator.compile.pipeline import plan_checkpoint
    from generator.model.load import load_model

    board, model = load_board("host-mpi"), checkpoints(MODELS["dense"])
    dense = load_model(model, load_tensors=False)
    one, plan = (plan_checkpoint(dense, model, board, "q8_0", 64, ranks=n) for n in (1, 3))
    spec, head = plan.spec, plan.spec.head_dim
    assert plan.kv_split == (True, True) and one.kv_split == (False, False)
    held = [{t.name: t for t in image.tensors} for image in rank_images(spec, plan.tensors, 3)]
    groups = [1, 1, 2]
    group_heads = spec.n_heads // spec.n_kv_heads
    assert [h["layers.0.wq"].rows for h in held] == [g * group_heads * head for g in groups]
    assert [h["layers.1.wk"].rows for h in held] == [g * head for g in groups]
    assert [h["layers.1.wv"].rows for h in held] == [g * head for g in groups]
    assert [h["layers.0.w_gate"].rows for h in held] == [32, 32, 32]  # the FFN: split by rows as before
    assert plan.kv_bytes == one.kv_bytes * 2 // 4  # 2 of the 4 groups' heads

    assert kv_group_split(spec, 4) == (True, True) and kv_group_split(spec, 5) == (False, False)
    assert kv_group_split(replace(spec, qk_norm_whole=True), 2) == (False, False)
    assert kv_group_split(replace(spec, kv_lora_rank=32), 2) == (False, False)
    hybrid = load_model(checkpoints(MODELS["hybrid"]), load_tensors=False).spec
    assert kv_group_split(hybrid, 2) == (False, True, False, True)  # convolution, attention, ...
    assert kv_group_split(hybrid, 4) == (False,) * 4  # 2 KV groups cannot go round 4 ranks


@building
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_keeps_only_its_kv_groups_cache(ranks, builder, checkpoints, capsys):
    """The decode test's dense builds (4 KV groups) over 2 and 4 ranks: report shows each rank's KV
    cache as its groups' share, the single board's / N (checked against the linked firmware's
    arena by report itself), in each rank's memory."""
    model = checkpoints(MODELS["dense"])
    builder.build(model, "q8_0", 64, "host-mpi", ranks=ranks)
    out = builder.root / f"{model.name}-q8_0-64-host-mpi-kvf16-ranks{ranks}"
    shares = main_json(capsys, "report", board="host-mpi", model=model, ctx=64, out=out, ranks=ranks)["ranks"]
    c = json.loads((model / "config.json").read_text())
    # keys and values (2) of binary16 (2 bytes), every layer, every position, 4 / N KV heads each
    share = 2 * 2 * c["num_hidden_layers"] * 64 * c["num_key_value_heads"] // ranks * c["head_dim"]
    assert [s["kv_cache_bytes"] for s in shares] == [share] * ranks


@building
@pytest.mark.parametrize("step", [0, 2])  # step 0: a prompt batch's last token; step 2: a decode pass
def test_the_checkpoints_of_ranks_split_by_kv_group_are_the_single_boards(step, builder, checkpoints):
    """verify's replay on 2 ranks of the dense model (its attention split by KV group): each rank
    computes its heads' q, k and v only, yet every checkpoint, q, k, v and their RoPE'd rows among
    them, hashes the single board's whole row (each gathered before it is hashed), so a replay
    names the same layer and operation as on one board."""
    from generator.verify_localise import localise_step

    def replay(request: RunRequest) -> RunResult:
        return run_ranks(builder, checkpoints(MODELS["dense"]), "localhost:2", request)[3]

    request = RunRequest(PROMPT, 3, stop_at_eos=False)
    _, art, plan = builder.build(checkpoints(MODELS["dense"]), "q8_0", 64, "host-mpi", ranks=2)
    loc = localise_step(plan, art.weights, request, step, None, replay)
    assert all(pair.equal for pair in loc.checkpoints), [(p.layer, p.op) for p in loc.checkpoints if not p.equal]
    assert {"q", "k", "v", "q_rope", "k_rope", "attention"} <= {pair.op for pair in loc.checkpoints}


@building
def test_the_rank_count_the_images_were_made_for_is_the_one_run(builder, checkpoints):
    board, art, _ = builder.build(checkpoints(MODELS["moe"]), "q8_0", 64, "host-mpi", ranks=2)
    firmware = Firmware(art.program, art.weights, art.model_hash(), rank_weights=art.rank_weights())
    with pytest.raises(
        ColibriError, match=r"^the weight images were made for 2 ranks and the hosts give 4: build for 4"
    ):
        run_firmware(board, firmware, LinkOptions(hosts=hosts_for(board, "localhost:4", None)), RunRequest(PROMPT, 2))
    assert rank_processes(0) == []


@building
def test_a_rank_handed_another_ranks_image_is_refused_before_any_rank_starts(builder, checkpoints):
    _, art, _ = builder.build(checkpoints(MODELS["moe"]), "q8_0", 64, "host-mpi", ranks=2)
    first, second = art.rank_weights()
    with pytest.raises(ColibriError) as e:
        run_ranks(builder, checkpoints(MODELS["moe"]), "localhost:2", RunRequest(PROMPT, 2), images=(first, first))
    assert str(e.value) == (
        f"rank 1: weight image {first} is rank 0's of 2, not rank 1's of 2: give rank 1 weights.rank1.img"
    )
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_a_rank_image_of_another_build_is_refused_naming_the_rank(builder, checkpoints):
    _, dense, _ = builder.build(checkpoints(MODELS["dense"]), "q8_0", 64, "host-mpi", ranks=2)
    _, moe, _ = builder.build(checkpoints(MODELS["moe"]), "q8_0", 64, "host-mpi", ranks=2)
    images = (moe.rank_weights()[0], dense.rank_weights()[1])
    with pytest.raises(ColibriError, match=r"^rank 1: weight image \S+weights.rank1.img is another build's"):
        run_ranks(builder, checkpoints(MODELS["moe"]), "localhost:2", RunRequest(PROMPT, 2), images=images)
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_the_rank_itself_refuses_another_ranks_image_and_no_rank_is_left(builder, checkpoints, monkeypatch):
    """The firmware's own check, as on a host whose file the CLI cannot read: the pre-check skipped."""
    import generator.device.links as links

    monkeypatch.setattr(links, "check_rank_images", lambda images, model: None)
    _, art, _ = builder.build(checkpoints(MODELS["moe"]), "q8_0", 64, "host-mpi", ranks=2)
    first, _ = art.rank_weights()
    start = time.monotonic()
    with pytest.raises(ColibriError) as e:
        run_ranks(
            builder, checkpoints(MODELS["moe"]), "localhost:2", RunRequest(PROMPT, 2), images=(first, first), timeout=60
        )
    assert str(e.value).startswith(f"rank 1: weight image {first}: weight image is another rank's"), str(e.value)
    assert time.monotonic() - start < 30
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_verify_with_hosts_passes_through_the_command(builder, checkpoints, capsys):
    model = checkpoints(MODELS["moe"])
    builder.build(model, "q8_0", 64, "host-mpi", ranks=2)  # the other tests' build: --out is its directory
    out = builder.root / f"{model.name}-q8_0-64-host-mpi-kvf16-ranks2"
    summary = main_json(
        capsys,
        "verify",
        board="host-mpi",
        model=model,
        ctx=64,
        out=out,
        hosts="localhost:2",
        prompt_ids="1,5,9",
        steps=6,
    )
    assert summary["pass"] and summary["board"] == "host-mpi"


def test_aarch64_ranks_run_under_qemu_with_the_sysroots_libraries(monkeypatch, tmp_path):
    from generator.boards import load_board

    monkeypatch.setenv("COLIBRI_SYSROOTS", str(tmp_path))
    board = load_board("linux-aarch64-mpi")
    prefix = board.runner.start_prefix(hosts_for(board, "localhost:2", None))
    assert prefix[0] == "mpirun" and prefix[prefix.index("--host") + 1] == "localhost:2"
    assert prefix[-3:] == ["qemu-aarch64", "-L", str(board.sysroot.path())]
    assert board.sysroot.path().parent == tmp_path and f"--sysroot={tmp_path}" in board.sysroot.link_flags()[0]


@building
def test_aarch64_ranks_under_qemu_decode_the_single_boards_bits(builder, checkpoints):
    """linux-aarch64-mpi: cross-compiled against the arm64 Open MPI sysroot (made once by the setup,
    about a minute, when missing), two ranks each under qemu-aarch64, started by this machine's
    mpirun. Slow (about 100 s on this 2-core machine under load): an aarch64 build of its own (its
    objects from the build cache, its generation not) and Open MPI's start under emulation."""
    from generator.boards import load_board
    from generator.device.setup_toolchain import ensure_toolchain

    ensure_toolchain(load_board("linux-aarch64-mpi"))
    model, seen = checkpoints(MODELS["dense"]), []
    board, art, plan = builder.build(model, "q8_0", 64, "linux-aarch64-mpi", ranks=2)
    firmware = Firmware(art.program, art.weights, art.model_hash(), rank_weights=art.rank_weights())
    how = LinkOptions(hosts=hosts_for(board, "localhost:2", None))
    request = RunRequest(PROMPT, 6, stop_at_eos=False)
    result = run_firmware(board, firmware, how, request, lambda step, token: seen.append(rank_processes(1)))
    assert_decodes_as_the_reference(plan, art, request, result)
    assert seen[0], "rank 1 was running while the tokens came"


def gathered_floats_per_token(model: Path, split_by_kv_group: bool) -> int:
    """The split rules' bytes on the wire, in floats: every gathered row once per decoded token
    (attention's q, k and v, or on a layer split by KV group its heads' outputs instead; then o,
    the FFN's gate, up and down per layer; then the vocabulary), each row computed on one rank and
    sent to the others."""
    c = json.loads((model / "config.json").read_text())
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    attention = q if split_by_kv_group else q + 2 * kv
    per_layer = attention + c["hidden_size"] + 2 * c["intermediate_size"] + c["hidden_size"]
    return c["num_hidden_layers"] * per_layer + c["vocab_size"]


# Started by the link in place of the firmware's command: the ranks in a network namespace of their
# own, whose loopback carries nothing else; its bytes sent before and after, written beside it.
COUNTED = """#!/bin/sh
exec unshare --net sh -c 'ip link set lo up; grep lo: /proc/net/dev > "$0.before"; "$@"; rc=$?
grep lo: /proc/net/dev > "$0.after"; exit $rc' "$0" "$@"
"""


def loopback_bytes_sent(counter: Path) -> int:
    sent = [int(Path(f"{counter}.{when}").read_text().split()[9]) for when in ("before", "after")]
    return sent[1] - sent[0]


def can_make_a_network_namespace() -> bool:
    """Root with unshare and ip (iproute2): CI runs as root."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True).returncode == 0


@building
@pytest.mark.skipif(not can_make_a_network_namespace(), reason="a network namespace of its own needs root")
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_bytes_on_the_wire_per_token_are_the_gathered_rows(ranks, builder, checkpoints, tmp_path, monkeypatch):
    """N ranks over Open MPI's TCP transport in a network namespace of the test's own (root: CI
    runs as root): per decoded token its loopback carries every gathered row N - 1 times, 4 bytes
    each (each rank's rows reach every other rank: the cost model's bytes per token,
    docs/several-boards.md): the dense model's 4 KV groups go round 2 and 4 ranks, so attention's
    q, k and v are not gathered but its heads' outputs, once; plus headers (TCP/IP's and MPI's:
    under 300 bytes per message, at most one message from each rank to each other per gather: 5 a
    layer), which is less than q, k and v's rows alone took when they were gathered. Shares the
    dense builds; two runs of about a second each."""
    counter = tmp_path / "counted"
    counter.write_text(COUNTED)
    counter.chmod(0o755)
    monkeypatch.setenv("COLIBRI_FIRMWARE_PREFIX", str(counter))
    monkeypatch.setenv("OMPI_MCA_btl", "tcp,self")  # no shared memory: every byte on the loopback
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "lo")
    model, sent = checkpoints(MODELS["dense"]), {}
    for steps in (2, 10):
        request = RunRequest(PROMPT, steps, stop_at_eos=False)
        _, art, plan, result = run_ranks(builder, model, f"localhost:{ranks}", request)
        assert_decodes_as_the_reference(plan, art, request, result)
        sent[steps] = loopback_bytes_sent(counter)
    per_token = (sent[10] - sent[2]) / 8
    assert all(plan.kv_split)
    payload = (ranks - 1) * 4 * gathered_floats_per_token(model, split_by_kv_group=True)
    config = json.loads((model / "config.json").read_text())
    messages = ranks * (ranks - 1) * (5 * config["num_hidden_layers"] + 1)
    assert payload <= per_token <= payload + 300 * messages, (per_token, payload)
    # less, headers and all, than the rows alone when q, k and v were gathered (7 gathers a layer)
    assert per_token < (ranks - 1) * 4 * gathered_floats_per_token(model, split_by_kv_group=False), per_token


@building
def test_memory_budget_applies_to_each_rank(builder, checkpoints, capsys):
    """report over 2 ranks: each rank's image and memory; a budget every rank's share fits but the
    whole model does not (one board refuses it) is accepted; one a rank's share does not fit is
    refused, naming the rank. The dense model: no expert cache that would let one board page."""
    from generator.cli import main

    model = checkpoints(MODELS["dense"])
    builder.build(model, "q8_0", 64, "host-mpi", ranks=2)  # the decode test's build: report links it
    out = builder.root / f"{model.name}-q8_0-64-host-mpi-kvf16-ranks2"
    unlimited = main_json(capsys, "report", board="host-mpi", model=model, ctx=64, out=out, ranks=2)
    shares = unlimited["ranks"]
    assert [s["image_bytes"] for s in shares] == [
        (out / "generated" / f"weights.rank{r}.img").stat().st_size for r in (0, 1)
    ]
    largest = max(shares, key=lambda s: s["memory_bytes"])
    whole = (out / "generated" / "weights.img").stat().st_size
    assert largest["memory_bytes"] < whole + largest["memory_bytes"] - largest["image_bytes"]
    budget = largest["memory_bytes"]
    fits = main_json(capsys, "report", board="host-mpi", model=model, ctx=64, out=out, ranks=2, memory_budget=budget)
    assert fits["rank_budget"] == budget and fits["ranks"] == shares
    assert main(["report", "--board", "host", "--model", str(model), "--ctx", "64", "--memory-budget", str(budget),
                 "--out", str(builder.root / "one-board")]) == 2  # fmt: skip
    assert "--memory-budget" in capsys.readouterr().err  # one board cannot hold the whole model in it
    assert main(["report", "--board", "host-mpi", "--model", str(model), "--ctx", "64", "--ranks", "2",
                 "--memory-budget", str(budget - 1), "--out", str(out)]) == 2  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"does not hold rank {largest['rank']}'s share" in err[0], err


@building
def test_a_rank_whose_experts_do_not_fit_its_budget_runs_them_through_the_expert_cache(builder, checkpoints, capsys):
    """A MoE over 2 ranks under the least budget every rank runs in (report's per-rank
    min_budget): each rank caches only its own experts (e mod 2) in fewer slots than it owns and
    decodes the single board's bits, greedy and sampled; the stats frame (hits, misses and slots
    summed over the ranks) says experts were read from storage. Under a budget that holds every
    rank's whole share (less than the whole model: one board pages there), no expert is read.
    Slow: a build of its own (a MoE whose experts outweigh a token's slots), then three runs."""
    model = checkpoints("qwen3_moe")  # 8 experts of 2 layers, top 3: each rank's 8 outweigh 3 slots
    builder.build(model, "q8_0", 64, "host-mpi", ranks=2)
    out = builder.root / f"{model.name}-q8_0-64-host-mpi-kvf16-ranks2"
    shares = main_json(capsys, "report", board="host-mpi", model=model, ctx=64, out=out, ranks=2)["ranks"]
    least = max(s["min_budget"] for s in shares)
    planned = main_json(capsys, "report", board="host-mpi", model=model, ctx=64, out=out, ranks=2, memory_budget=least)
    slots = [s["slots"] for s in planned["ranks"]]
    assert all(0 < n < s["routed_experts"] for n, s in zip(slots, planned["ranks"])), planned["ranks"]
    for sampling in (SamplingParams(), SAMPLED):
        request = RunRequest(PROMPT, 8, sampling, stop_at_eos=False, memory_budget=least)
        _, art, plan, result = run_ranks(builder, model, "localhost:2", request)
        assert_decodes_as_the_reference(plan, art, request, result)
        held = cache_stats(result)
        assert (held.budget, held.slots) == (least, sum(slots)) and held.cache_misses > 0 and held.read_bytes > 0
    whole_share = max(s["memory_bytes"] for s in shares)
    assert whole_share < (out / "generated" / "weights.img").stat().st_size + whole_share - shares[0]["image_bytes"]
    request = RunRequest(PROMPT, 8, SAMPLED, stop_at_eos=False, memory_budget=whole_share)
    _, art, plan, result = run_ranks(builder, model, "localhost:2", request)
    assert_decodes_as_the_reference(plan, art, request, result)
    held = cache_stats(result)
    assert (held.slots, held.cache_misses, held.read_bytes, held.prefill_read_bytes) == (0, 0, 0, 0)


def test_a_rank_needs_slots_only_for_the_experts_it_holds(checkpoints, tmp_path):
    """The MoE (6 experts, top 2) over 4 ranks, planned: ranks 0 and 1 hold 2 of each layer's
    experts, ranks 2 and 3 one, so a token can route at most that many of its experts to each: its
    least budget is its fixed part and that many slots. One byte below the largest least budget is
    refused in one line naming that rank; at it, every rank has a slot per expert a token can bring
    it, fewer than the experts it holds where it holds more; auto is refused with its reason."""
    from generator.boards import load_board
    from generator.compile.build import prepare
    from generator.compile.cache_plan import AutoBudget, check_rank_budget

    board = load_board("host-mpi")
    _, plan = prepare(board, checkpoints(MODELS["moe"]), "q8_0", 64, tmp_path / "out", ranks=4)
    shares = check_rank_budget(plan, board.budget_reserve, 0).shares
    assert [s.experts_per_layer for s in shares] == [2, 2, 1, 1]
    assert [s.min_slots for s in shares] == [2, 2, 1, 1]
    assert all(s.min_budget == min(s.fixed_bytes + s.min_slots * s.slot_bytes, s.memory_bytes) for s in shares)
    least = max(shares, key=lambda s: s.min_budget)
    with pytest.raises(ColibriError, match=rf"^--memory-budget [0-9,]+ B does not hold rank {least.rank}'s share"):
        check_rank_budget(plan, board.budget_reserve, least.min_budget - 1)
    for share in check_rank_budget(plan, board.budget_reserve, least.min_budget).shares:
        assert share.slots == 0 or share.min_slots <= share.slots <= share.max_slots
    with pytest.raises(ColibriError, match="^--memory-budget auto is not taken on MPI ranks: ranks sharing a host"):
        check_rank_budget(plan, board.budget_reserve, AutoBudget(0))


def rank_processes(rank: int) -> list[int]:
    """This test's descendants that are MPI rank `rank` (their environment says which)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ and descends_from_us(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


def descends_from_us(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(status.split("PPid:")[1].split()[0])
    return False


@building
def test_two_loopback_addresses_through_the_local_sshd_are_two_hosts(builder, checkpoints, tmp_path, monkeypatch):
    from sshd import Sshd

    addresses = ("127.0.0.2", "127.0.0.3")
    server = Sshd(tmp_path / "sshd", extra_config="".join(f"ListenAddress {a}\n" for a in addresses))
    try:
        monkeypatch.setenv("COLIBRI_SSH_COMMAND", f"ssh -F {server.hosts_config(addresses)}")
        request = RunRequest(PROMPT, 6, SAMPLED, stop_at_eos=False)
        _, art, plan, result = run_ranks(builder, checkpoints(MODELS["moe"]), "127.0.0.2:1,127.0.0.3:1", request)
        assert_decodes_as_the_reference(plan, art, request, result)
        log = (server.root / "sshd.log").read_text()
        # mpirun's daemon started on each host over SSH, one connection to each address
        assert all(f" on {a} port {server.port} " in log for a in addresses)
        assert log.count("Accepted publickey") == 2
    finally:
        server.stop()


class OnRank1WhileWorking:
    """Does `act` to rank 1's processes once, while the ranks work: at the first token the host
    reads (the on_token callback), or 0.2 s after both ranks are running, whichever comes first
    (mpirun may forward the tokens late on a loaded machine, and the whole decode could end before
    the host reads its first token)."""

    def __init__(self, act):
        self.act, self.done, self.when = act, [], []
        self.lock, self.over = threading.Lock(), threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)

    def __call__(self, step: int = 0, token: int = 0) -> None:
        with self.lock:
            if not self.done:
                self.done.extend(rank_processes(1))
                self.when.append(time.monotonic())
                for pid in self.done:
                    self.act(pid)

    def watch(self) -> None:
        while not self.done and not self.over.wait(0.01):
            if rank_processes(1) and rank_processes(0):
                time.sleep(0.2)
                self()

    def __enter__(self):
        self.watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self.over.set()
        self.watcher.join()


@building
def test_a_rank_killed_mid_decode_is_named_and_no_rank_is_left(builder, checkpoints):
    request = RunRequest(PROMPT, 60, stop_at_eos=False)
    with OnRank1WhileWorking(lambda pid: os.kill(pid, signal.SIGKILL)) as kill_rank_1:
        with pytest.raises(ColibriError) as e:
            run_ranks(builder, checkpoints(MODELS["moe"]), "localhost:2", request, kill_rank_1, timeout=60)
    assert len(kill_rank_1.done) == 1
    assert str(e.value).startswith("rank 1 on host ") and "killed by signal 9 (SIGKILL)" in str(e.value)
    assert time.monotonic() - kill_rank_1.when[0] < 30  # mpirun's notice, not the timeout
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_a_stalled_rank_ends_in_the_timeout_and_no_rank_is_left(builder, checkpoints):
    request = RunRequest(PROMPT, 60, stop_at_eos=False)
    # SIGSTOP: alive, silent: rank 0 waits for it in a collective
    with OnRank1WhileWorking(lambda pid: os.kill(pid, signal.SIGSTOP)) as stop_rank_1:
        with pytest.raises(ColibriError, match=r"no complete result from the firmware within 8 s"):
            run_ranks(builder, checkpoints(MODELS["moe"]), "localhost:2", request, stop_rank_1, timeout=8)
    assert len(stop_rank_1.done) == 1
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_an_expert_read_that_fails_on_rank_1_is_named_with_its_host_and_no_rank_is_left(builder, checkpoints, tmp_path):
    """Rank 1 pages its own experts (the least budget: fewer slots than it holds) from an image whose
    experts' bytes are damaged (its header and directory intact, so it opens): its first read of one
    fails the expert's CRC-32 while rank 0 waits for its share in a gather. Its line names rank 1,
    its host and the expert; every rank ends at once, not at the run's timeout."""
    from generator.boards import load_board
    from generator.compile.cache_plan import check_rank_budget

    model = checkpoints("qwen3_moe")  # the budget test's build: each rank's 8 experts outweigh its slots
    _, art, plan = builder.build(model, "q8_0", 64, "host-mpi", ranks=2)
    least = max(s.min_budget for s in check_rank_budget(plan, load_board("host-mpi").budget_reserve, 0).shares)
    first, second = art.rank_weights()
    blob = second.read_bytes()
    for index, tensor in enumerate(directory(second)[1]):
        if b".experts." in tensor["name"] and tensor["bytes"] > 0:  # rank 1's own experts (odd ids)
            blob = tensor_edited(blob, index, tensor["bytes"] // 2, fix_directory=False)
    damaged = tmp_path / second.name
    damaged.write_bytes(blob)
    request = RunRequest(PROMPT, 8, stop_at_eos=False, memory_budget=least)
    start = time.monotonic()
    with pytest.raises(ColibriError) as e:
        run_ranks(builder, model, "localhost:2", request, images=(first, damaged), timeout=60)
    took = time.monotonic() - start
    message = str(e.value)
    assert re.match(r"rank 1 on host \S+: error 17: weight image tensor data is corrupted .*: layer \d+ expert \d*[13579] "
                    r".*its bytes fail their CRC-32", message), message  # fmt: skip
    assert "\n" not in message and message.endswith("; mpirun ended the other ranks"), message
    assert took < 30, took  # the failing rank ends every rank, not the run's timeout
    assert rank_processes(0) == [] and rank_processes(1) == []


@building
def test_a_host_that_cannot_be_reached_is_named(builder, checkpoints):
    # 127.0.0.2: a loopback address with no sshd on port 22, so ssh is refused at once.
    model = checkpoints(MODELS["dense"])
    builder.build(model, "q8_0", 64, "host-mpi", ranks=2)  # built before the clock starts
    request = RunRequest(PROMPT, 4, stop_at_eos=False)
    start = time.monotonic()
    with pytest.raises(ColibriError) as e:
        run_ranks(builder, model, "localhost:1,127.0.0.2:1", request, timeout=60)
    assert "a host of the ranks cannot be reached" in str(e.value) and "127.0.0.2" in str(e.value)
    assert time.monotonic() - start < 30
    assert rank_processes(0) == []


@pytest.mark.parametrize(
    "hosts, problem",
    [
        ("-oProxyCommand=x:1", "is not a host name"),
        ("localhost:0", "slots must be a count from 1"),
        ("localhost:two", "slots must be a count from 1"),
    ],
)
def test_hosts_outside_mpiruns_grammar_are_refused_before_building(hosts, problem):
    from generator.boards import load_board

    with pytest.raises(ColibriError, match=problem):
        hosts_for(load_board("host-mpi"), hosts, None)


def test_a_hostfile_is_checked_line_by_line(tmp_path):
    from generator.boards import load_board

    good = tmp_path / "hosts"
    good.write_text("# the boards\nlocalhost slots=2\n127.0.0.1 slots=2 max_slots=4\n")
    assert hosts_for(load_board("host-mpi"), None, good)[:2] == ("--hostfile", str(good))
    bad = tmp_path / "bad"
    bad.write_text("localhost slots=2 && reboot\n")
    with pytest.raises(ColibriError, match=r"line 1: '&&' is not slots=N"):
        hosts_for(load_board("host-mpi"), None, bad)


def inventory(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    return path


def test_an_ansible_inventory_gives_the_ranks_hosts(tmp_path):
    from generator.boards import load_board

    # ansible_host is the address (else the name), colibri_slots the ranks on it; group variables too
    listed = inventory(
        tmp_path,
        "[pis]\npi2 ansible_host=127.0.0.3\npi1 ansible_host=127.0.0.2 colibri_slots=2\n"
        "[here]\nlocalhost ansible_port=22\n[pis:vars]\ncolibri_root=/opt/colibri\n",
    )
    where = hosts_for(load_board("host-mpi"), None, None, listed)
    assert where[:2] == ("--host", "localhost:1,127.0.0.2:2,127.0.0.3:1")  # by host name, as deploy


@pytest.mark.parametrize(
    "text, problem",
    [
        ("# every board is gone\n", "names no host"),
        ("pi1 ansible_host=-oProxyCommand=reboot\n", "host pi1: '-oProxyCommand=reboot' is not a host name"),
        ("pi1 ansible_host=127.0.0.2 ansible_port=2222\n", "host pi1: ansible_port=2222 cannot reach mpirun"),
        ("pi1 colibri_slots=0\n", "colibri_slots: slots must be a count from 1"),
    ],
)
def test_an_inventory_mpirun_cannot_take_is_refused_in_one_line(tmp_path, text, problem):
    from generator.boards import load_board

    with pytest.raises(ColibriError, match=re.escape(problem)) as e:
        hosts_for(load_board("host-mpi"), None, None, inventory(tmp_path, text))
    assert "\n" not in str(e.value) and str(e.value).startswith("--inventory ")


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--board", "host", "--hosts", "localhost:2"],
            "--hosts is for boards that run MPI ranks (host-mpi, linux-aarch64-mpi)",
        ),
        (
            ["--board", "host-mpi", "--hosts", "localhost:2", "--hostfile", "f"],
            "with one of --hosts, --hostfile or --inventory",
        ),
        (
            ["--board", "host", "--inventory", "f"],
            "--inventory is for boards that run MPI ranks (host-mpi, linux-aarch64-mpi)",
        ),
        (["--board", "host-mpi", "--inventory", "no-such-file"], "--inventory no-such-file: no such file"),
    ],
)
def test_the_command_refuses_hosts_it_cannot_use_in_one_line(args, line, capsys, tmp_path):
    from generator.cli import main

    assert main(["run", *args, "--prompt-ids", "1,2", "--out", str(tmp_path / "out")]) == 2
    err = [e for e in capsys.readouterr().err.splitlines() if e.strip()]
    assert len(err) == 1 and err[0].startswith("colibri: error: ") and line in err[0], err
    assert not (tmp_path / "out").exists()


def test_ranks_on_a_board_that_runs_one_process_are_refused_in_one_line(capsys, tmp_path, checkpoints):
    from generator.cli import main

    model = checkpoints(MODELS["dense"])
    capsys.readouterr()  # making the checkpoint says its progress
    assert (
        main(["build", "--board", "host", "--ranks", "2", "--model", str(model), "--out", str(tmp_path / "out")]) == 2
    )
    err = [e for e in capsys.readouterr().err.splitlines() if e.strip()]
    assert err == [
        "colibri: error: board host runs one process, not MPI ranks: build for ranks on an MPI board (host-mpi)"
    ]
    assert not (tmp_path / "out").exists()
