"""Images past 4 GiB: a qwen3moe GGUF of 4.8 GB written directly as blocks (tools/make_moe_gguf.py:
three layers of 128 Q4_0 experts, the last layer's lying across 2^32), built with --quant gguf,
decoded on host and on linux-aarch64 (qemu) with experts placed past 2^32, bit for bit as the NumPy
reference decodes, with and without a memory budget. Each offset and size in the generated C is
64-bit, and a layer's experts are one table row rather than a constant per matrix."""

import json
import re
import shutil
import subprocess
import sys

import pytest
from cli_runs import verify_passes
from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # writes and runs images past 2 and 4 GiB

PROMPT = "1,17,400,3,250"
SHAPE = [
    "--layers",
    "3",
    "--experts",
    "128",
    "--top-k",
    "2",
    "--expert-ffn",
    "3584",
    "--heads",
    "16",
    "--kv-heads",
    "4",
    "--vocab",
    "1024",
    "--seed",
    "5",
]


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """The GGUF file and its host build; removed afterwards (14 GB with the aarch64 build)."""
    root = tmp_path_factory.mktemp("large-image")
    model = root / "moe-4.8g.gguf"
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "make_moe_gguf.py"), str(model), *SHAPE],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    out = root / "host"
    done = run_cli(
        "build", "--board", "host", "--model", model, "--quant", "gguf", "--ctx", "64", "--out", out, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield model, out
    shutil.rmtree(root, ignore_errors=True)


def experts_past_2_32(out, expert_counts) -> list[str]:
    """The routed experts a run used whose bytes lie past 2^32 in the image."""
    plan = json.loads((out / "generated" / "plan.json").read_text())
    start = {t["name"]: plan["image"]["data_offset"] + t["offset"] for t in plan["tensors"]}
    return [
        f"layers.{layer}.experts.{e}"
        for layer, counts in expert_counts.items()
        for e, n in enumerate(counts)
        if n and start[f"layers.{layer}.experts.{e}.w_down"] >= 2**32
    ]


def test_an_image_past_4_gib_builds_with_64_bit_constants_and_a_readable_header(large):
    model, out = large
    image = out / "generated" / "weights.img"
    assert image.stat().st_size > 2**32
    header = (out / "generated" / "model_def.h").read_text()
    # Every offset and size is a 64-bit constant; a layer's experts are one group of constants.
    offsets = re.findall(r"#define COLIBRI_(?:T|EG)_\w+_(?:OFFSET|BYTES|STRIDE|AT) (\S+)", header)
    assert offsets and all(v.endswith("ull") or v.endswith("ll") for v in offsets)
    assert "COLIBRI_T_LAYERS_2_EXPERTS" not in header
    assert "#define COLIBRI_EG_LAYERS_2_STRIDE" in header
    group = int(re.search(r"#define COLIBRI_EG_LAYERS_2_OFFSET (\d+)ull", header).group(1))
    stride = int(re.search(r"#define COLIBRI_EG_LAYERS_2_STRIDE (\d+)ull", header).group(1))
    assert group < 2**32 < group + 128 * stride  # the last layer's experts lie across 2^32
    # 3 x 128 x 3 expert matrices, not a constant each (they would add some 80 kB to the header).
    assert not re.search(r"COLIBRI_T_LAYERS_\d+_EXPERTS_\d+", header) and len(header) < 100_000


@pytest.mark.parametrize("budget", ["0", "1G"])
def test_experts_past_2_32_decode_the_references_bits_on_host(large, budget):
    model, out = large
    settings = dict(model=model, quant="gguf", ctx=64, prompt_ids=PROMPT)
    result = verify_passes(out, timeout=1200, board="host", **settings, steps=4, memory_budget=budget)
    assert experts_past_2_32(out, result["expert_counts"]["firmware"])


def test_experts_past_2_32_decode_the_references_bits_on_linux_aarch64(large, tmp_path_factory):
    model, _ = large
    out = tmp_path_factory.mktemp("large-aarch64") / "build"
    try:
        settings = dict(model=model, quant="gguf", ctx=64, prompt_ids=PROMPT)
        result = verify_passes(out, timeout=2400, board="linux-aarch64", **settings, steps=2, memory_budget="1G")
        assert experts_past_2_32(out, result["expert_counts"]["firmware"])
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
