"""The weight-image loader against the damaged-image table and beyond: under ASan + UBSan, built
32-bit, fuzzed with libFuzzer, and on qemu-rv32 (where size_t is 32 bits, as on the ESP32-P4)."""

import shutil
import subprocess

import numpy as np
import pytest
from conftest import REPO
from damaged_images import cases, flip
from libfuzzer import build_fuzzer, run_fuzzer
from safetensors.numpy import save_file

from generator.boards import load_board
from generator.compile.pipeline import generate

pytestmark = pytest.mark.slow  # damaged images on the host, qemu-rv32 and linux-aarch64 firmware

RUNTIME = REPO / "firmware_src" / "runtime"
C_TESTS = REPO / "tests" / "c"

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 40,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_model(path, seed):
    import json

    rng = np.random.default_rng(seed)
    d, f, v = 32, 32, 40
    shapes = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
        "model.layers.0.input_layernorm.weight": (d,),
        "model.layers.0.post_attention_layernorm.weight": (d,),
        "model.layers.0.self_attn.q_proj.weight": (d, d),
        "model.layers.0.self_attn.k_proj.weight": (16, d),
        "model.layers.0.self_attn.v_proj.weight": (16, d),
        "model.layers.0.self_attn.o_proj.weight": (d, d),
        "model.layers.0.mlp.gate_proj.weight": (f, d),
        "model.layers.0.mlp.up_proj.weight": (f, d),
        "model.layers.0.mlp.down_proj.weight": (d, f),
    }
    path.mkdir(parents=True)
    save_file({k: rng.normal(0, 0.5, s).astype(np.float32) for k, s in shapes.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(TINY))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The tiny model's generated sources, its image, and the damaged-image table written to files."""
    root = tmp_path_factory.mktemp("loader")
    host = load_board("host")
    gen = generate(tiny_model(root / "model", 1), host, "q8_0", 16, root / "gen")
    other = generate(tiny_model(root / "other", 2), host, "q8_0", 16, root / "other-gen")
    f32 = generate(root / "model", host, "f32", 16, root / "f32-gen")
    blob = (root / "gen" / "weights.img").read_bytes()
    table = cases(
        blob, (root / "other-gen" / "weights.img").read_bytes(), (root / "f32-gen" / "weights.img").read_bytes()
    )
    table["empty"] = (b"", 1)
    files = {}
    for name, (image, code) in table.items():
        files[name] = (root / f"{name}.img", code)
        files[name][0].write_bytes(image)
    assert gen.model_hash != other.model_hash and f32.model_hash == f32.model_hash
    return root, files


@pytest.fixture(scope="module")
def moe_images(tmp_path_factory, checkpoints):
    """A MoE model's image (qwen3_moe: routed experts) and the table, with the damage only a routed
    expert shows."""
    from damaged_images import routed_expert_cases

    root = tmp_path_factory.mktemp("loader-moe")
    host = load_board("host")
    generate(checkpoints("qwen3_moe"), host, "q8_0", 16, root / "gen")
    generate(checkpoints("qwen3_moe", seed=99), host, "q8_0", 16, root / "other-gen")
    generate(checkpoints("qwen3_moe"), host, "f32", 16, root / "f32-gen")
    blob = (root / "gen" / "weights.img").read_bytes()
    table = cases(
        blob, (root / "other-gen" / "weights.img").read_bytes(), (root / "f32-gen" / "weights.img").read_bytes()
    )
    table.update(routed_expert_cases(blob))
    files = {}
    for name, (image, code) in table.items():
        files[name] = (root / f"{name}.img", code)
        files[name][0].write_bytes(image)
    return root, files


def loader_sources(root) -> list:
    """The loader and what it links: the runtime's files and the model's generated data (one rank)."""
    loader = ("image_loader.c", "checksum.c", "weights.c", "tensor_table.c", "ranks/none.c")
    return [*(RUNTIME / name for name in loader), root / "gen" / "model_data.c"]


def build(root, name, cc, flags):
    out = root / name
    sources = [C_TESTS / "loader_harness.c", *loader_sources(root)]
    cmd = [
        cc,
        "-std=c11",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{RUNTIME}",
        f"-I{root / 'gen'}",
        *flags,
        *map(str, sources),
        "-o",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def check_table(harness, root, files):
    names = sorted(files)
    done = subprocess.run(
        [str(harness), str(root / "gen" / "weights.img"), *(str(files[n][0]) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = [int(c) for c in done.stdout.split()]
    assert codes[0] == 0, "the valid image must load"
    wrong = {n: (got, files[n][1]) for n, got in zip(names, codes[1:]) if got != files[n][1]}
    assert not wrong, f"name: (got, expected): {wrong}"


def check_table_resident(harness, root, files):
    """Opening checks the resident tensors only; every code of the table still comes, at open or when
    the damaged expert is first brought in, and an expert's damage only then."""
    names = sorted(files)
    done = subprocess.run(
        [str(harness), "--resident", str(root / "gen" / "weights.img"), *(str(files[n][0]) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [tuple(map(int, line.split())) for line in done.stdout.splitlines()]
    assert rows[0] == (0, 0), "the valid image must load"
    wrong = {}
    for name, (opened, expert) in zip(names, rows[1:]):
        got = opened or expert
        if got != files[name][1] or ("expert" in name) != (opened == 0):
            wrong[name] = (opened, expert, files[name][1])
    assert not wrong, f"name: (at open, at first use, expected): {wrong}"


def check_every_prefix_and_bit(harness, root):
    image = root / "gen" / "weights.img"
    size = image.stat().st_size
    for mode in ("truncations", "bitflips"):
        done = subprocess.run([str(harness), str(image), mode], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        counts = dict(tuple(map(int, line.split())) for line in done.stdout.splitlines())
        assert 0 not in counts, f"{mode}: {counts.get(0)} damaged images were accepted"
        assert sum(counts.values()) == size


SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def test_loader_under_asan_and_ubsan(images):
    root, files = images
    harness = build(root, "harness-asan", "gcc", SANITIZE)
    check_table(harness, root, files)
    check_every_prefix_and_bit(harness, root)


def test_moe_image_table_checked_at_open_and_at_first_use_under_asan_and_ubsan(moe_images):
    root, files = moe_images
    harness = build(root, "harness-asan", "gcc", SANITIZE)
    check_table(harness, root, files)  # every tensor at open: an MCU board
    check_table_resident(harness, root, files)  # resident at open, experts when brought in: a Linux board


def test_loader_built_32_bit(images):
    root, files = images
    harness = build(
        root,
        "harness-m32",
        "gcc",
        ["-m32", "-msse2", "-mfpmath=sse", "-fsanitize=undefined", "-fno-sanitize-recover=all"],
    )
    assert harness.read_bytes()[4] == 1, "ELFCLASS32"
    check_table(harness, root, files)
    check_table_resident(harness, root, files)
    check_every_prefix_and_bit(harness, root)


def test_libfuzzer_finds_no_crash_in_a_bounded_run(images, tmp_path):
    fuzz(*images, tmp_path, seconds=20)


def test_libfuzzer_on_a_moe_image_opened_both_ways(moe_images, tmp_path):
    fuzz(*moe_images, tmp_path, seconds=10)


def fuzz(root, files, tmp_path, seconds):
    sources = [C_TESTS / "fuzz_loader.c", *loader_sources(root)]
    fuzzer = build_fuzzer(
        tmp_path / "fuzz_loader",
        "-DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION",
        f"-I{RUNTIME}",
        f"-I{root / 'gen'}",
        *sources,
    )
    seeds = tmp_path / "seeds"
    corpus = tmp_path / "corpus"
    seeds.mkdir()
    corpus.mkdir()
    shutil.copy(root / "gen" / "weights.img", seeds / "valid")
    for name, (path, _) in sorted(files.items()):
        shutil.copy(path, seeds / name)
    run = run_fuzzer(fuzzer, corpus, seeds, tmp_path, f"-max_total_time={seconds}", malloc_limit_mb=1024, timeout=180)
    assert "Done" in run.stderr and not list(tmp_path.glob("crash-*"))


def test_the_table_on_qemu_rv32_where_size_t_is_32_bits(images, builder, checkpoints, tmp_path):
    from damaged_images import cases as table_for

    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest
    from generator.errors import ColibriError

    board, art, plan = builder.build(checkpoints("qwen2_bias"), "q8_0", 64, "qemu-rv32")
    blob = art.weights.read_bytes()
    other = builder.build(checkpoints("qwen2_bias", seed=99), "q8_0", 64, "qemu-rv32")[1].weights.read_bytes()
    f32_image = builder.build(checkpoints("qwen2_bias"), "f32", 64, "qemu-rv32")[1].weights.read_bytes()
    table = table_for(blob, other, f32_image)
    # In a flash window the header's length is the image's length (the region goes on after it):
    # bytes after the image are not an error, and a shorter length cuts the image, trailer and all.
    skip = {"trailing_bytes"}
    in_region = {"length_field_smaller": 2}
    for name, (image, code) in sorted(table.items()):
        if name in skip:
            continue
        code = in_region.get(name, code)
        path = tmp_path / f"{name}.img"
        path.write_bytes(image)
        with pytest.raises(ColibriError, match=f"firmware reported error {code}:"):
            run_on_board(board, art.program, art.weights, RunRequest([1, 2], 2), art.model_hash(), flash_image=path)
    assert flip(blob, 0) != blob
