"""Generation at real sizes: the weight image streams tensor by tensor from the checkpoint's files
through worker processes into the output file, with bounded memory, the same bytes at any job count
and as an independent whole-model derivation, progress on long runs, nothing left on failure, and
no-op builds that do not read a large checkpoint again."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import DEFAULT_MODEL, REPO, run_cli

from generator.boards import load_board
from generator.compile import image as image_mod
from generator.compile import image_format as fmt
from generator.compile.image import directory_entry, image_header, spec_identity, write_image
from generator.compile.pipeline import WEIGHTS_FILE, generate
from generator.compile.plan import plan_for_board
from generator.errors import ColibriError
from generator.model.family_facts import FAMILIES
from generator.model.hf.names import canonical_name
from generator.model.load import load_model
from generator.numerics.quantize import quantize_q4_0, quantize_weights_q8_0

pytestmark = pytest.mark.slow  # generates images from large checkpoints

HOST = load_board("host")


# ---- an independent derivation of the image: the whole model in memory, laid out at once ----


def oracle_image(model_dir: Path, quant: str, ctx: int) -> bytes:
    """The image as the format defines it, derived without the streaming writer: every tensor
    loaded whole by the safetensors package (through torch: it holds bfloat16), quantized whole,
    laid out in one buffer."""
    from safetensors.torch import load_file

    plan = plan_for_board(load_model(model_dir, load_tensors=False).spec, HOST, quant, ctx)
    values = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        for hf_name, tensor in load_file(shard).items():
            name = canonical_name(hf_name, plan.spec.family)
            if name is not None:
                values[name] = tensor.float().numpy()
    if FAMILIES[plan.spec.family].norms.plus_one:
        values = {k: (np.float32(1.0) + v).astype(np.float32) if k.endswith("norm") else v for k, v in values.items()}
    layout = plan.image
    data = bytearray(layout.data_bytes)
    directory = bytearray()
    for t in plan.tensors:
        array = values[t.name].reshape(t.rows, t.cols)
        if t.dtype == "f32":
            blob = array.astype("<f4").tobytes()
            data[t.offset : t.offset + len(blob)] = blob
        else:
            qs, d = quantize_weights_q8_0(array) if t.dtype == "q8_0" else quantize_q4_0(array)
            data[t.offset : t.offset + qs.size] = qs.tobytes()
            scales = d.astype("<f2").tobytes()
            data[t.offset + t.scales_offset : t.offset + t.scales_offset + len(scales)] = scales
        directory += directory_entry(t, zlib.crc32(data[t.offset : t.offset + t.extent]))
    model_hash = hashlib.sha256(
        b"colibri-image-v3\0" + spec_identity(plan) + quant.encode() + bytes(data) + bytes(directory)
    ).digest()
    out = bytearray(layout.image_bytes)
    out[: fmt.HEADER_BYTES] = image_header(plan, model_hash)
    out[layout.dir_offset : layout.dir_offset + len(directory)] = directory
    out[layout.data_offset : layout.data_offset + len(data)] = data
    out[-fmt.TRAILER_BYTES :] = struct.pack("<I", zlib.crc32(out[: layout.data_offset])) + fmt.END_MAGIC
    return bytes(out)


CASES = [  # (model, quant): dense f32 / q8_0 / q4_0, MoE in bf16, kept-f32 experts, Gemma's folded norms
    ("kjv-tiny", "f32"),
    ("kjv-tiny", "q8_0"),
    ("kjv-tiny", "q4_0"),
    ("mixtral_moe", "q8_0"),
    ("mixtral_moe", "q4_0"),
    ("qwen3_moe_odd_experts", "q8_0"),
    ("qwen3_moe_odd_experts", "q4_0"),
    ("gemma3_text", "q8_0"),
]


def model_for(name: str, checkpoints) -> Path:
    if name == "kjv-tiny":
        return DEFAULT_MODEL
    return checkpoints(name, dtype="bfloat16") if name == "mixtral_moe" else checkpoints(name)


@pytest.mark.parametrize("name,quant", CASES)
def test_streamed_image_equals_the_whole_model_derivation_at_any_job_count(
    name, quant, checkpoints, tmp_path, monkeypatch
):
    model = model_for(name, checkpoints)
    # Small pieces: every matrix is cut into several, so pieces of one tensor meet in the file.
    monkeypatch.setattr(image_mod, "PIECE_VALUES", 1000)
    expected = oracle_image(model, quant, 32)
    ckpt = load_model(model)
    plan = plan_for_board(ckpt.spec, HOST, quant, 32)
    assert max(len(image_mod.pieces(t, None, 0)) for t in plan.tensors) > 2
    for jobs in (1, 2, 3):
        written = write_image(plan, ckpt.tensors, tmp_path / f"j{jobs}.img", jobs=jobs)
        blob = (tmp_path / f"j{jobs}.img").read_bytes()
        assert blob == expected, f"{name} {quant} with {jobs} jobs"
        assert written.model_hash == blob[56:88]
        assert written.identity == hashlib.sha256(blob[: plan.image.data_offset]).digest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j1.img", "j2.img", "j3.img"]  # no temporary left
    # Tensors given as arrays (an importer that decodes in memory) make the same image.
    arrays = {name: tensor.load() for name, tensor in ckpt.tensors.items()}
    write_image(plan, arrays, tmp_path / "arrays.img", jobs=2)
    assert (tmp_path / "arrays.img").read_bytes() == expected


def test_generate_writes_the_same_files_at_any_job_count(checkpoints, tmp_path):
    model = checkpoints("mixtral_moe", dtype="bfloat16")
    outs = [generate(model, HOST, "q8_0", 32, tmp_path / f"j{jobs}", jobs=jobs) for jobs in (1, 2)]
    names = sorted(p.name for p in (tmp_path / "j1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "j2").iterdir()) and WEIGHTS_FILE in names
    for n in names:
        assert (tmp_path / "j1" / n).read_bytes() == (tmp_path / "j2" / n).read_bytes(), n
    assert outs[0].model_hash == outs[1].model_hash


# ---- failures mid-generation: one line, nothing written ----


def _flip_to_nan(shard: Path, info) -> None:
    with open(shard, "r+b") as f:  # the last value of the tensor becomes NaN (bf16 0x7fc0)
        f.seek(info.end - 2)
        f.write(struct.pack("<H", 0x7FC0))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bad_tensor_late_in_the_model_leaves_nothing_behind(checkpoints, tmp_path, jobs):
    src = checkpoints("mixtral_moe", dtype="bfloat16")
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    ckpt = load_model(model)
    last = ckpt.tensors[list(ckpt.tensors)[-1]]
    _flip_to_nan(last.path, last.info)
    out = tmp_path / "gen"
    with pytest.raises(ColibriError) as e:
        generate(model, HOST, "q8_0", 32, out, jobs=jobs)
    assert "contains NaN or Inf" in str(e.value) and "\n" not in str(e.value)
    assert list(out.iterdir()) == []  # neither the image nor a temporary


def test_a_shard_truncated_during_generation_is_one_line_and_leaves_nothing(checkpoints, tmp_path):
    src = checkpoints("mixtral_moe", dtype="bfloat16")
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    ckpt = load_model(model)  # headers checked: the file was whole
    plan = plan_for_board(ckpt.spec, HOST, "q8_0", 32)
    shard = model / "model.safetensors"
    os.truncate(shard, shard.stat().st_size - 1000)  # then it loses its end
    with pytest.raises(ColibriError) as e:
        write_image(plan, ckpt.tensors, tmp_path / "out" / WEIGHTS_FILE, jobs=2)
    assert "truncated" in str(e.value) and "\n" not in str(e.value)
    assert list((tmp_path / "out").iterdir()) == []
    # Through the command line the header check refuses it before anything is built.
    done = run_cli("build", "--model", model, "--out", tmp_path / "build")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "past the" in done.stderr and not (tmp_path / "build").exists()


# ---- a model much larger than the memory bound ----


def write_bf16_checkpoint(out: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> Path:
    """A safetensors checkpoint written tensor by tensor (random bf16 values, norms near 1), so
    making it never holds more than one tensor."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            n = int(np.prod(shape))
            values = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            if name.endswith("norm.weight"):
                values += np.float32(1.0)
            f.write((values.view(np.uint32) >> 16).astype("<u2").tobytes())
    return out


def big_llama(out: Path, layers: int = 8, hidden: int = 1024, ffn: int = 2816, vocab: int = 32000) -> Path:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (hidden, hidden),
                p + "self_attn.k_proj.weight": (hidden, hidden),
                p + "self_attn.v_proj.weight": (hidden, hidden),
                p + "self_attn.o_proj.weight": (hidden, hidden),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "mlp.gate_proj.weight": (ffn, hidden),
                p + "mlp.up_proj.weight": (ffn, hidden),
                p + "mlp.down_proj.weight": (hidden, ffn),
            }
        )
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return write_bf16_checkpoint(out, config, shapes)


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    """170 M parameters, 340 MB of bf16 (680 MB as float32, 1.3 GB at the 7.5 bytes per parameter
    generation once took); its largest tensor is 11.5 MB as float32."""
    return big_llama(tmp_path_factory.mktemp("big") / "llama-170m-bf16", layers=12, vocab=8000)


GENERATE_AND_MEASURE = """
import resource, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from generator.compile import pipeline
from generator.compile.pipeline import generate
from generator.boards import load_board
pipeline.PROGRESS_SECONDS = 0.25  # a line every quarter second, however fast this machine is
start = time.monotonic()
generate(Path({model!r}), load_board("host"), "q8_0", 64, Path({out!r}), progress=lambda m: print(m, flush=True),
         jobs={jobs})
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print("MEASURED", hwm * 1024, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
      time.monotonic() - start)
"""


def test_generation_memory_is_bounded_by_the_largest_tensor_not_the_model(big_model, tmp_path):
    ckpt = load_model(big_model)
    largest_f32 = max(4 * int(np.prod(t.shape)) for t in ckpt.tensors.values())
    model_f32 = sum(4 * int(np.prod(t.shape)) for t in ckpt.tensors.values())
    bound = 2 * largest_f32 + 150 * 2**20
    assert model_f32 > 2 * bound  # the model could not fit in the bound
    script = GENERATE_AND_MEASURE.format(repo=str(REPO), model=str(big_model), out=str(tmp_path / "gen"), jobs=2)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    main_peak, worker_peak, seconds = done.stdout.strip().splitlines()[-1].split()[1:]
    main_peak, worker_peak = int(main_peak), int(worker_peak)
    print(
        f"peak RSS: generating process {main_peak / 2**20:.0f} MiB, largest worker {worker_peak / 2**20:.0f} MiB, "
        f"bound {bound / 2**20:.0f} MiB, model {model_f32 / 2**20:.0f} MiB as float32, {float(seconds):.1f} s"
    )
    assert main_peak < bound and worker_peak < bound, (main_peak, worker_peak, bound)
    # A long generation reports progress every couple of seconds: tensors, bytes, time left.
    lines = done.stdout.splitlines()
    assert lines[0].startswith("quantizing 111 tensors to q8_0 (")
    progress = [line for line in lines if line.startswith("quantizing weights: ")]
    assert progress and all(
        " tensors, " in line and " MB of 181.3 MB, " in line and line.endswith(" s left") for line in progress
    ), lines
    assert (tmp_path / "gen" / WEIGHTS_FILE).stat().st_size == plan_for_board(
        ckpt.spec, HOST, "q8_0", 64
    ).image.image_bytes


# ---- incremental builds: a large input is not read again on a no-op build ----


def _scons_generate(model: Path, out: Path) -> tuple[str, float]:
    scons = Path(sys.executable).parent / "scons"
    start = time.monotonic()
    done = subprocess.run(
        [
            str(scons),
            "-Q",
            "-C",
            str(REPO),
            "board=host",
            f"model={model}",
            "quant=q8_0",
            "ctx=64",
            f"out={out}",
            "jobs=2",
            str(out / "generated" / WEIGHTS_FILE),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, time.monotonic() - start


def test_a_no_op_build_trusts_a_large_shards_size_and_time_and_a_changed_one_regenerates(tmp_path):
    from generator.compile.build import LARGE_INPUT_BYTES, model_input_signature

    model = big_llama(tmp_path / "model", layers=2, hidden=512, ffn=1024, vocab=8000)
    shard = model / "model.safetensors"
    assert shard.stat().st_size > LARGE_INPUT_BYTES
    small, stamp = model_input_signature(sorted(model.iterdir()))
    assert small == [model / "config.json"] and stamp.startswith("model.safetensors size=")
    out = tmp_path / "build"
    log, _ = _scons_generate(model, out)
    assert "GEN" in log
    image = out / "generated" / WEIGHTS_FILE
    first = image.read_bytes()

    log, _ = _scons_generate(model, out)
    assert "GEN" not in log  # no-op

    # Same size, same modification time, different data: the build does not read the shard, so
    # it does not notice (what trusting size and time means; the header, which planning reads, is
    # left alone).
    stat = shard.stat()
    info = load_model(model).tensors["layers.1.w_down"].info
    with open(shard, "r+b") as f:
        f.seek(info.begin)
        f.write(b"\x01\x3f" * 16)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    log, _ = _scons_generate(model, out)
    assert "GEN" not in log and image.read_bytes() == first

    # Its time changes (as any write makes it): regenerated, with the new values.
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    log, _ = _scons_generate(model, out)
    assert "GEN" in log and image.read_bytes() != first
    log, _ = _scons_generate(model, out)
    assert "GEN" not in log

    # A small file is still judged by its content: config.json rewritten with the same bytes and a
    # new time rebuilds nothing.
    config = model / "config.json"
    config.write_text(config.read_text())
    log, _ = _scons_generate(model, out)
    assert "GEN" not in log


def test_jobs_must_be_a_positive_count(tmp_path):
    done = run_cli("build", "--jobs", "0", "--out", tmp_path / "b")
    assert done.returncode == 2 and "--jobs" in done.stderr and not (tmp_path / "b").exists()
    scons = Path(sys.executable).parent / "scons"
    done = subprocess.run(
        [str(scons), "-Q", "-C", str(REPO), "board=host", f"out={tmp_path / 'c'}", "jobs=two"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "colibri: error: jobs must be a positive integer, got 'two'" in done.stderr


@pytest.mark.parametrize("ggml_type,block_type", [("Q8_0", "q8_0"), ("Q4_0", "q4_0"), ("Q4_1", "q4_1")])
def test_kept_gguf_blocks_are_the_images_packing_of_their_values(ggml_type, block_type):
    """The image's bytes for a GGUF file's blocks are the file's fields as they are: the same as
    packing the blocks' decoded quants the image's way (quantize.pack_nibbles) and rounding their
    float32 scales to binary16."""
    from generator.model.gguf.tensors import KEPT_RECORDS, QuantBlocks
    from generator.numerics.quantize import HALF, keep_blocks, pack_nibbles

    record = KEPT_RECORDS[ggml_type]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (4, 8, record.itemsize), dtype=np.uint8)
    halves = rng.uniform(-2, 2, (4, 8, 2)).astype(HALF)  # finite scales and minimums
    raw[..., 0:2] = halves[..., :1].view(np.uint8)
    if ggml_type == "Q4_1":
        raw[..., 2:4] = halves[..., 1:].view(np.uint8)
    blocks = QuantBlocks(ggml_type, raw)
    values, scales, mins = keep_blocks(*blocks.fields(), block_type)
    q = blocks.quants.astype(np.int16) + (8 if ggml_type == "Q4_0" else 0)
    expected = q.astype(np.int8) if ggml_type == "Q8_0" else pack_nibbles(q)
    assert values.tobytes() == expected.tobytes()
    assert scales.tobytes() == blocks.scales.astype(HALF).tobytes()
    assert (mins is None) == (ggml_type != "Q4_1")
    if mins is not None:
        assert mins.tobytes() == blocks.offsets.astype(HALF).tobytes()


def test_a_kept_block_with_an_infinite_scale_is_refused():
    from generator.model.gguf.tensors import KEPT_RECORDS, QuantBlocks
    from generator.numerics.quantize import keep_blocks

    raw = np.zeros((2, 4, KEPT_RECORDS["Q4_0"].itemsize), np.uint8)
    raw[1, 2, 0:2] = np.array([np.inf], "<f2").view(np.uint8)
    with pytest.raises(ColibriError, match="q4_0 cannot hold these weights: a block scale is infinite or NaN"):
        keep_blocks(*QuantBlocks("Q4_0", raw).fields(), "q4_0")
