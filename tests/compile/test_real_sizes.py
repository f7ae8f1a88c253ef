"""Real model shapes: the planned sizes in docs/real-sizes.md, and a Gemma-3-270M-shaped checkpoint
(random weights: no hub is reachable) built and verified end to end on host."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # plans and reports real-size models

CONFIGS = REPO / "models" / "configs"


def test_real_sizes_document_is_current():
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "real_sizes.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_gpt_oss_20b_plans_at_its_published_shape():
    import math

    from generator.compile.cache_plan import cache_constants
    from generator.compile.plan import make_plan
    from generator.model.hf.load import config_only_spec

    spec = config_only_spec(CONFIGS / "gpt-oss-20b")
    assert spec.layer_windows == (128, 0) * 12 and spec.n_experts == 32 and spec.experts_per_token == 4
    assert spec.rope.scaling == "yarn" and not spec.rope.truncate
    assert spec.rope.attention_factor == 0.1 * math.log(32.0) + 1.0
    plan = make_plan(spec, "linux-aarch64", "q8_0", 4096)
    assert round(sum(t.rows * t.cols for t in plan.tensors) / 1e9, 1) == 20.9  # "21B parameters"
    c = cache_constants(plan, 0)
    # One expert: gate and up 2880 x 2880, down 2880 x 2880, q8_0 (34 bytes per 32 values).
    assert c.expert_bytes == 3 * 2880 * 2880 // 32 * 34 and c.max_slots == 24 * 32
    # Resident: both 201088 x 2880 embeddings in q8_0 and the layers' attention, with every bias.
    assert 1.8e9 < c.resident_bytes < 2.0e9


@pytest.mark.parametrize(
    "name, billions, active, state",
    [
        # LFM2-8B-A1B: "8.3B total, 1.5B active"; 18 short-convolution layers keep 3 inputs of 2048
        # (the window's last 2 and the pass's token).
        ("lfm2-8b-a1b", 8.3, (1.5, 1.6), 18 * 3 * 2048 * 4),
        # Granite-4.0-H-Tiny: "7B total (6.9B), 1B active" (rounded down: the embedding alone is 0.15B);
        # 36 Mamba-2 layers keep 3 inputs of the convolution (3072 + 2 x 128 wide) and 48 heads' 64 x 128
        # states.
        ("granite-4.0-h-tiny", 6.9, (1.0, 1.5), 36 * (3 * (3072 + 2 * 128) + 48 * 64 * 128) * 4),
    ],
)
def test_edge_hybrids_plan_at_their_published_shapes(name, billions, active, state):
    from generator.compile.plan import make_plan
    from generator.model.hf.load import config_only_spec

    spec = config_only_spec(CONFIGS / name)
    plan = make_plan(spec, "linux-aarch64", "q8_0", 4096)
    assert round(sum(t.rows * t.cols for t in plan.tensors) / 1e9, 1) == billions
    routed = sum(t.rows * t.cols for t in plan.tensors if ".experts." in t.name)
    per_token = sum(t.rows * t.cols for t in plan.tensors) - routed * (1 - spec.experts_per_token / spec.n_experts)
    assert active[0] <= per_token / 1e9 < active[1]
    assert plan.linear_state_bytes == state  # the fixed state, whatever the context
    assert f"| {name} |" in (REPO / "docs" / "real-sizes.md").read_text()


def test_report_of_a_config_that_does_not_fit_names_region_need_and_budget():
    done = run_cli("report", "--board", "esp32p4", "--model", CONFIGS / "smollm2-135m")
    assert done.returncode == 2
    assert (
        "colibri: error: smollm2-135m (q8_0, context 128) does not fit board esp32p4: region l2mem needs" in done.stderr
    )
    assert "but has 393,216 B" in done.stderr
    assert "planned, not linked" in done.stdout and "weights" in done.stdout


def test_report_json_of_a_config_on_host(tmp_path):
    done = run_cli("report", "--board", "host", "--model", CONFIGS / "qwen3-0.6b", "--ctx", "1024", "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["planned_only"] and rep["fits"] and rep["n_ctx"] == 1024
    (ram,) = rep["regions"]
    # 28 layers x 1024 positions x 8 KV heads x 128 x (K and V) x 2 bytes (the default binary16 cache)
    assert ram["items"]["kv_cache"] == 28 * 1024 * 8 * 128 * 2 * 2


def test_gemma3_270m_shaped_random_checkpoint_verifies_on_host(tmp_path):
    import torch
    import transformers

    config = json.loads((CONFIGS / "gemma-3-270m" / "config.json").read_text())
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(270)
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**fields)).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "gemma-3-270m-random")
    del model
    done = run_cli(
        "verify",
        "--model",
        tmp_path / "gemma-3-270m-random",
        "--prompt-ids",
        "2,818,5279,13",
        "--steps",
        "4",
        "--ctx",
        "32",
        "--out",
        tmp_path / "build",
        "--json",
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["pass"] and len(result["firmware"]["tokens"]) == 4
