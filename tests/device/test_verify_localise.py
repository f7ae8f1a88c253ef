"""verify localises a divergence: the first divergent step replayed with its checkpoints (protocol 7's
trace=STEP, runtime/checkpoint.h) on the board and in the reference's hook, and the first operation
whose output differs named with its layer, kernel, inputs and difference. A correct build's
checkpoints all equal the reference's (so any difference is the build's); broken builds (fused
multiply-adds from a board file, a kernel changed in a scratch copy of the tree) are named where
they break."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from conftest import DEFAULT_MODEL, REPO, run_cli
from sshd import ALIAS, Sshd

from generator.boards import load_board
from generator.device.protocol import encode_frame, parse_frame
from generator.device.runner import run_on_board
from generator.device.session import Checkpoint, RunRequest, RunResult, Session
from generator.errors import ColibriError
from generator.numerics.sampling import SamplingParams
from generator.verify_localise import localise, localise_step, reference_checkpoints


def replay_on(board, art):
    def replay(request: RunRequest) -> RunResult:
        return run_on_board(board, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image)

    return replay


REQUEST = RunRequest([1, 2, 3, 4, 5], 3, SamplingParams(), stop_at_eos=False)


@pytest.mark.parametrize("kind", ["kjv-tiny", "qwen3_moe", "lfm2_moe", "gemma4_moe"])
@pytest.mark.parametrize("step", [0, 2])  # step 0: a prompt batch's last token; step 2: a decode pass
def test_every_checkpoint_of_a_correct_build_equals_the_reference(builder, checkpoints, kind, step):
    model = DEFAULT_MODEL if kind == "kjv-tiny" else checkpoints(kind)
    board, art, plan = builder.build(model, "q8_0", 64)
    loc = localise_step(plan, art.weights, REQUEST, step, None, replay_on(board, art))
    assert loc.kind in ("not reproduced", "sampling")  # reference_token None: only the checkpoints count
    assert all(pair.equal for pair in loc.checkpoints), [(p.layer, p.op) for p in loc.checkpoints if not p.equal]
    ops = {pair.op for pair in loc.checkpoints}
    assert {"embedding", "attn_norm", "mixer", "ffn", "layer_out", "final_norm", "logits"} <= ops
    assert len([p for p in loc.checkpoints if p.op == "layer_out"]) == plan.spec.n_layers
    if plan.spec.n_experts:
        assert {"router", "experts", "expert_weights"} <= ops


@pytest.mark.slow
@pytest.mark.parametrize("board", ["qemu-rv32", "linux-aarch64"])
def test_an_emulated_board_sends_the_same_checkpoints_within_its_links_frames(builder, board):
    """The replay on qemu-rv32 (its UART, as an ESP32-P4's) and linux-aarch64 (qemu-aarch64's pipe),
    with the builds the session shares: every checkpoint equal to the reference's, each frame far
    below the firmware's 2048-byte line buffer and the host's 4096-byte frame limit."""
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, board)
    loc = localise_step(plan, art.weights, REQUEST, 1, None, replay_on(b, art))
    assert loc.checkpoints and all(pair.equal for pair in loc.checkpoints)
    longest = max(
        len(
            encode_frame(
                99999,
                "checkpoint",
                {
                    "layer": p.layer,
                    "op": p.op,
                    "n": p.n,
                    "sha": p.firmware_sha256,
                    "values": ",".join(p.firmware_values or []),
                },
            )
        )
        for p in loc.checkpoints
    )
    assert longest < 300


def test_the_same_router_with_other_experts_is_a_routing_divergence(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    traced = replace(REQUEST, steps=2, trace=1)
    fw = replay_on(board, art)(traced)
    ref = reference_checkpoints(plan, art.weights, traced, 1)
    moe_layer = next(i for i, moe in enumerate(plan.spec.moe_layers) if moe)

    def changed(c: Checkpoint) -> Checkpoint:
        return replace(c, sha256="0" * 64) if (c.layer, c.op) == (moe_layer, "experts") else c

    routed = localise(plan, 1, replace(fw, checkpoints=[changed(c) for c in fw.checkpoints]), ref, fw.tokens[1], False)
    assert (routed.kind, routed.layer, routed.op, routed.inputs_equal) == ("routing", moe_layer, "experts", True)
    assert "routing divergence" in routed.line() and "router_route" in routed.line()
    # every checkpoint equal and another token: sampling
    sampled = localise(plan, 1, fw, ref, fw.tokens[1] + 1, False)
    assert sampled.kind == "sampling" and "sampling divergence" in sampled.line()


def verify_json(*args, cwd=REPO) -> dict:
    done = run_cli("verify", *args, "--ctx", "64", "--steps", "4", "--prompt-ids", "1,2,3", "--json", cwd=cwd)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def scratch_tree(tmp_path_factory):
    """A copy of the tree whose SwiGLU kernels scale their outputs by 1.0001 (a kernel a few hundred
    ULPs off, as a port could bring): the AVX2 set's, the RV32 set's own, and the fallback's that
    the NEON set runs."""
    tree = tmp_path_factory.mktemp("scratch") / "tree"
    for part in ("generator", "firmware_src", "templates", "targets", "SConstruct", "pyproject.toml"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, tree / part)
    for kernel, call in (
        ("x86_avx2/set.c", "swiglu_avx2(up, gate, n);"),
        ("rv32/vector.c", "up[i] = op_silu_inline(gate[i]) * up[i];"),
        ("fallback.h", "kernel_scalar_swiglu(up, gate, n);"),
    ):
        path = tree / "firmware_src/runtime/kernels" / kernel
        text = path.read_text()
        assert text.count(call) == 1
        scaled = (
            " up[i] = up[i] * 1.0001f;" if "[i]" in call else " for (int i = 0; i < n; i++) up[i] = up[i] * 1.0001f;"
        )
        path.write_text(text.replace(call, call + scaled))
    return tree


@pytest.mark.slow
@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32"])
def test_a_kernel_changed_in_a_scratch_copy_of_the_tree_is_named(scratch_tree, board, tmp_path):
    """verify of the scratch tree's build names layer 0's FFN activation, its inputs equal, on each
    kind of board (a process, user-mode emulation, an emulated MCU's serial link). Slow: it compiles
    the copy's firmware for the board (its other objects come from the build cache)."""
    trace = tmp_path / "trace.jsonl"
    doc = verify_json(
        "--board", board, "--model", DEFAULT_MODEL, "--out", tmp_path / "build", "--trace", trace, cwd=scratch_tree
    )
    loc = doc["localisation"]
    assert doc["first_divergent_step"] == 0
    assert (loc["kind"], loc["layer"], loc["op"], loc["inputs_equal"]) == ("operation", 0, "ffn_activation", True)
    assert "swiglu" in loc["kernel"] and loc["largest_ulps"] > 0
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert rows[0]["localisation"]["op"] == "ffn_activation"
    assert [(r["layer"], r["op"]) for r in rows[1:] if not r["equal"]][0] == (0, "ffn_activation")


@pytest.mark.slow
def test_a_board_file_with_fused_multiply_adds_is_localised(tmp_path):
    """A board file with fused multiply-adds: the first operation that differs is one that
    multiplies and adds, its inputs equal, its difference a few ULPs."""
    doc = verify_json("--board", fused_host_board(tmp_path), "--out", tmp_path / "build")
    loc = doc["localisation"]
    assert loc["kind"] == "operation" and loc["inputs_equal"] is True
    assert loc["op"] not in ("embedding", "attn_residual", "layer_out")  # additions alone do not fuse
    assert 0 < loc["largest_ulps"] < 1 << 20


def fused_host_board(tmp_path):
    """host.toml copied outside the repository with -ffp-contract=fast -mfma (the build the
    self-test's test makes: shared through the build cache)."""
    text = load_board("host").path.read_text()
    fused = tmp_path / "host-fused.toml"
    fused.write_text(
        text.replace('name = "host"', 'name = "host-fused"').replace(
            '"-ffp-contract=off"', '"-ffp-contract=fast", "-mfma"'
        )
    )
    return fused


@pytest.fixture
def sshd(tmp_path):
    server = Sshd(tmp_path / "sshd")
    yield server
    server.stop()


@pytest.mark.slow
def test_a_divergence_is_localised_over_ssh_as_over_the_pipe(tmp_path, sshd, monkeypatch):
    """The fused host build run over SSH (a local sshd, test_remote.py's): the replay goes over the
    same channel and names the same operation as the run through a pipe."""
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", sshd.ssh_command())
    monkeypatch.setenv("COLIBRI_REMOTE_CACHE", str(tmp_path / "board-cache"))
    monkeypatch.setenv("COLIBRI_REMOTE_PREFIX", "")
    fused, out = fused_host_board(tmp_path), tmp_path / "build"
    piped = verify_json("--board", fused, "--out", out)["localisation"]
    remote = verify_json("--board", fused, "--out", out, "--remote", ALIAS)
    assert remote["remote"]["firmware_machine"] == "x86_64"
    assert remote["localisation"] == piped


def test_a_trace_file_that_is_a_directory_is_refused_before_anything_is_built(tmp_path):
    done = run_cli("verify", "--prompt-ids", "1,2", "--steps", "2", "--out", tmp_path / "b", "--trace", tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        == f"colibri: error: --trace {tmp_path} is a directory: give the file to write the checkpoints to"
    )
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"layer": "0", "op": "q", "n": "4", "sha": "ab" * 31, "values": "3f800000"}, "sha is not a SHA-256"),
        ({"layer": "-2", "op": "q", "n": "4", "sha": "ab" * 32, "values": "3f800000"}, "layer=-2 is below -1"),
        ({"layer": "0", "op": "q", "n": "4", "sha": "ab" * 32, "values": "3f80000,1"}, "values is not a list"),
    ],
)
def test_a_malformed_checkpoint_frame_is_refused(fields, says):
    session = Session()
    with pytest.raises(ColibriError, match=says):
        session.handle(parse_frame(encode_frame(3, "checkpoint", fields).rstrip(b"\n")))


def test_a_checkpoint_frame_is_kept_in_the_order_sent():
    session = Session()
    fields = {"layer": "-1", "op": "embedding", "n": "64", "sha": "ab" * 32, "values": "3f800000,bf800000"}
    session.handle(parse_frame(encode_frame(1, "checkpoint", fields).rstrip(b"\n")))
    assert session.result.checkpoints == [Checkpoint(-1, "embedding", 64, "ab" * 32, ["3f800000", "bf800000"])]
