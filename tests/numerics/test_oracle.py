"""Oracle: the f32 firmware's logits match transformers, and the q8_0 firmware matches the NumPy
reference bit for bit, for every supported architecture."""

import numpy as np
import pytest

from generator.numerics.sampling import SamplingParams
from generator.reference import Reference
from models import ORACLE_CONFIGS, load_hf

pytestmark = pytest.mark.slow  # transformers runs every family as the oracle

PROMPT = [1, 17, 42, 99, 7]
STEPS = 28  # > 24 decode steps, and longer than the Mistral sliding window (8)


@pytest.mark.parametrize("kind", sorted(ORACLE_CONFIGS))
def test_f32_firmware_matches_transformers(kind, checkpoints, builder, tmp_path):
    import torch

    model_dir = checkpoints(kind)
    logits_file = tmp_path / "logits.f32"
    art, plan, request, result = builder.run(model_dir, PROMPT, STEPS, quant="f32", logits_out=logits_file)
    assert len(result.tokens) == STEPS
    fw = np.fromfile(logits_file, dtype="<f4").reshape(STEPS, plan.spec.vocab_size)

    # transformers sees the prompt and the firmware's own tokens: position len(PROMPT)-1+i predicts step i.
    ids = torch.tensor([PROMPT + result.tokens[:-1]])
    with torch.no_grad():
        hf = load_hf(model_dir)(ids).logits[0, len(PROMPT) - 1 :].numpy()
    assert hf.shape == fw.shape
    for step in range(STEPS):
        scale = np.abs(hf[step]).max()
        err = np.abs(fw[step] - hf[step]).max()
        assert err <= 1e-4 * scale, f"step {step}: max |diff| {err:.3g} > 1e-4 x {scale:.3g}"
    assert np.argmax(hf[0]) == result.tokens[0] or np.sort(hf[0])[-1] - np.sort(hf[0])[-2] < 1e-4 * scale


@pytest.mark.parametrize("kind", sorted(ORACLE_CONFIGS))
@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)],
    ids=["greedy", "sampled"],
)
def test_q8_0_firmware_is_bit_identical_to_the_reference(kind, sampling, checkpoints, builder):
    model_dir = checkpoints(kind)
    art, plan, request, result = builder.run(model_dir, PROMPT, STEPS, quant="q8_0", sampling=sampling)
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, STEPS, sampling, stop_at_eos=False)
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests
    assert result.expert_counts == ref.expert_counts
    if plan.spec.n_experts:
        # Every MoE layer reports its routing: k selections per forward pass.
        assert set(result.expert_counts) == {i for i, m in enumerate(plan.spec.moe_layers) if m}
        passes = len(PROMPT) + STEPS - 1
        assert all(sum(c) == plan.spec.experts_per_token * passes for c in result.expert_counts.values())


def test_f32_firmware_is_bit_identical_to_the_reference_too(checkpoints, builder):
    """The scalar f32 path follows the same summation order as the reference."""
    model_dir = checkpoints("qwen3_qknorm")
    art, plan, request, result = builder.run(model_dir, PROMPT, 12, quant="f32")
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, 12, SamplingParams(), stop_at_eos=False)
    assert result.digests == ref.digests


def test_sharded_bfloat16_checkpoint_imports_and_matches_transformers(checkpoints, builder, tmp_path):
    import torch

    model_dir = checkpoints("qwen2_bias", dtype="bfloat16", max_shard_size="40KB")
    assert (model_dir / "model.safetensors.index.json").is_file()
    logits_file = tmp_path / "logits.f32"
    art, plan, request, result = builder.run(model_dir, PROMPT, 4, quant="f32", logits_out=logits_file)
    fw = np.fromfile(logits_file, dtype="<f4").reshape(4, plan.spec.vocab_size)
    with torch.no_grad():
        hf = load_hf(model_dir)(torch.tensor([PROMPT + result.tokens[:-1]])).logits[0, len(PROMPT) - 1 :].numpy()
    assert np.abs(fw - hf).max() <= 1e-4 * np.abs(hf).max()


def test_text_tower_of_a_gemma3_multimodal_checkpoint_matches_transformers(builder, tmp_path_factory):
    from transformers import Gemma3ForConditionalGeneration

    from models import make_gemma3_multimodal, transformers_logits

    model_dir = make_gemma3_multimodal(tmp_path_factory.mktemp("gemma3mm") / "model")
    logits_file = tmp_path_factory.mktemp("gemma3mm-logits") / "logits.f32"
    art, plan, request, result = builder.run(model_dir, PROMPT, 12, quant="f32", logits_out=logits_file)
    assert plan.spec.architecture == "Gemma3ForConditionalGeneration" and plan.spec.post_norms
    fw = np.fromfile(logits_file, dtype="<f4").reshape(12, plan.spec.vocab_size)
    hf = transformers_logits(Gemma3ForConditionalGeneration, model_dir, PROMPT, result.tokens)
    assert np.abs(fw - hf).max() <= 1e-4 * np.abs(hf).max()


@pytest.mark.parametrize("kind", ["gemma3_text", "qwen2_moe_shared", "mixtral_moe"])
def test_gemma3_and_moe_are_bit_identical_on_qemu_rv32(kind, checkpoints, builder):
    sampling = SamplingParams(0.9, top_k=40, seed=3)
    art, plan, request, result = builder.run(
        checkpoints(kind), PROMPT, 20, quant="q8_0", sampling=sampling, board="qemu-rv32"
    )
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, 20, sampling, stop_at_eos=False)
    assert result.hello["board"] == "qemu-rv32"
    assert result.tokens == ref.tokens and result.digests == ref.digests
    assert result.expert_counts == ref.expert_counts
