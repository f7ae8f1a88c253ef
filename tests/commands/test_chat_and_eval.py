"""Chat keeps a conversation in the firmware's KV cache between turns; eval scores a text on the
board by llama.cpp's perplexity protocol. Both are checked against what no cache and no board can
change: one run over the whole transcript, and the NumPy reference's bits."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import zlib

import pytest
from conftest import DEFAULT_MODEL, REPO
from gguf_files import gemma3_gguf

from generator.chat import ChatState
from generator.compile.image import map_image
from generator.device.links import open_link
from generator.device.protocol import FrameReader
from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.errors import ColibriError
from generator.evaluate import evaluate
from generator.model.chat_template import ChatTemplate
from generator.model.tokenizer import Tokenizer
from generator.numerics.perplexity import chunks, perplexity
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

pytestmark = pytest.mark.slow  # chat and eval on built firmware against the reference

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MESSAGES = ["And God said", "Let there be light", "And the evening and the morning"]
# Genesis 1:1-8 (King James Version, public domain): the kind of text the bundled model learnt.
TEXT = """In the beginning God created the heaven and the earth. And the earth was without form, and void; and
darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said,
Let there be light: and there was light. And God saw the light, that it was good: and God divided the light
from the darkness. And God called the light Day, and the darkness he called Night. And the evening and the
morning were the first day. And God said, Let there be a firmament in the midst of the waters, and let it
divide the waters from the waters. And God made the firmament, and divided the waters which were under the
firmament from the waters which were above the firmament: and it was so. And God called the firmament Heaven.
And the evening and the morning were the second day.
"""


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The bundled model with a chat template beside its tokenizer."""
    model = tmp_path_factory.mktemp("chat") / "kjv-chat"
    shutil.copytree(DEFAULT_MODEL, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def chat(builder, model, board: str, sampling=SamplingParams(), ctx: int = 128, steps: int = 10):
    """Three turns on `board`: each turn's plan and result."""
    b, art, plan = builder.build(model, "q8_0", ctx, board)
    state = ChatState(ChatTemplate.for_model(model), Tokenizer.for_model(model), plan.n_ctx, steps)
    turns = []
    with open_link(b, art.program, art.weights, art.model_hash(), flash_image=art.flash_image, keep_open=True) as conv:
        for message in MESSAGES:
            planned = state.plan_turn(message)
            result = conv.turn(RunRequest(planned.prompt, planned.steps, sampling, start=planned.start))
            state.finish_turn(planned, result.tokens, result.held)
            turns.append((planned, result))
    return b, art, plan, turns


def transcript(turns) -> list[int]:
    """Every token the last turn's reply was computed from: the prompts and the replies fed back."""
    ids: list[int] = []
    for planned, result in turns[:-1]:
        ids += planned.prompt + result.tokens[:-1]
    return ids + turns[-1][0].prompt


@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32"])
def test_a_conversation_continues_in_the_kv_cache_and_decodes_what_one_run_over_the_transcript_does(
    builder, chat_model, board
):
    b, art, plan, turns = chat(builder, chat_model, board)
    for i, (planned, result) in enumerate(turns):
        assert not planned.reprefilled
        assert planned.start == (0 if i == 0 else turns[i - 1][1].held)
        assert result.held == planned.start + len(planned.prompt) + len(result.tokens) - 1
    whole = transcript(turns)
    assert len(turns[-1][0].prompt) < len(whole) // 3, "the last turn sends only its new tokens"
    last = turns[-1][1]
    once = run_on_board(
        b,
        art.program,
        art.weights,
        RunRequest(whole, len(last.tokens), SamplingParams(), stop_at_eos=False),
        art.model_hash(),
        flash_image=art.flash_image,
    )
    assert once.tokens == last.tokens and once.digests == last.digests
    ref = Reference(plan, map_image(art.weights)).generate(whole, len(last.tokens), SamplingParams(), False)
    assert ref.tokens == last.tokens and ref.digests == last.digests


def test_a_sampled_conversation_draws_what_one_sampled_run_draws(builder, chat_model):
    sampling = SamplingParams(temperature=0.9, top_k=40, seed=7)
    b, art, plan, turns = chat(builder, chat_model, "host", sampling)
    last = turns[-1][1]
    once = run_on_board(
        b,
        art.program,
        art.weights,
        RunRequest(transcript(turns), len(last.tokens), sampling, stop_at_eos=False),
        art.model_hash(),
    )
    assert once.tokens == last.tokens and once.digests == last.digests


@pytest.mark.parametrize("board", ["host", "qemu-rv32"])  # the builds of the conversation test above
def test_a_repetition_penalty_looks_back_over_the_whole_conversation_as_the_reference_does(builder, chat_model, board):
    """llama.cpp's repetition penalty, its window spanning the turns the firmware holds: the last
    reply is the reference's over the transcript, bit for bit, and not the unpenalized one."""
    penalty = SamplingParams(repeat_penalty=1.5, repeat_last_n=48)
    b, art, plan, turns = chat(builder, chat_model, board, penalty)
    last = turns[-1][1]
    ref = Reference(plan, map_image(art.weights))
    penalized = ref.generate(transcript(turns), len(last.tokens), penalty, False)
    assert penalized.tokens == last.tokens and penalized.digests == last.digests
    plain = ref.generate(transcript(turns), len(last.tokens), SamplingParams(), False)
    assert plain.tokens != last.tokens


def request_line(body: str) -> bytes:
    return f"{body} *{zlib.crc32(body.encode()):08x}\n".encode()


def serve(art, *bodies: str):
    done = subprocess.run(
        [str(art.program), "--weights", str(art.weights)],
        capture_output=True,
        timeout=60,
        input=b"".join(request_line(b) for b in bodies),
    )
    reader = FrameReader()
    reader.feed(done.stdout)
    return done.returncode, reader.frames


def test_the_linux_firmware_serves_request_lines_until_stdin_ends_and_continues_only_where_it_holds(builder):
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64)
    code, frames = serve(
        art,
        "@CLB 0 request prompt=1,5,9 steps=3",
        "@CLB 1 request prompt=7,8 steps=2 start=5",
        "@CLB 2 request prompt=7 steps=2 start=3",
    )
    done = [f for f in frames if f.kind == "done"]
    assert [d.fields["held"] for d in done] == ["5", "8"]  # 3 + 2 fed, then 5 + 2 + 1 fed
    errors = [f for f in frames if f.kind == "error"]
    assert len(errors) == 1 and errors[0].fields["msg"].startswith("start must be 0 or the tokens the firmware holds")
    assert code == 1 and [f.kind for f in frames].count("hello") == 1


def test_a_conversation_that_would_overflow_the_context_is_refused(builder, chat_model):
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64)
    code, frames = serve(art, "@CLB 0 request prompt=1,5,9 steps=40", "@CLB 1 request prompt=7,8 steps=30 start=42")
    assert frames[-1].kind == "error" and "the conversation is full" in frames[-1].fields["msg"]
    state = ChatState(ChatTemplate.for_model(chat_model), Tokenizer.for_model(chat_model), 24, 8)
    with pytest.raises(ColibriError, match="the context is full: the conversation would need .* of the 24 positions"):
        state.plan_turn(" ".join(["And God said"] * 10))


def test_the_chat_command_streams_json_turns_from_standard_input(chat_model, tmp_path):
    done = subprocess.run(
        [
            str(REPO / "colibri"),
            "chat",
            "--model",
            str(chat_model),
            "--ctx",
            "128",
            "--steps",
            "6",
            "--greedy",
            "--json",
            "--out",
            str(tmp_path / "build"),
        ],
        input="\n".join(MESSAGES) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    turns = [json.loads(line) for line in done.stdout.splitlines()]
    assert [t["user"] for t in turns] == MESSAGES
    assert turns[0]["start"] == 0 and turns[1]["start"] == turns[0]["held"] > 0
    assert all(t["prefilled"] == len(t["prompt"]) for t in turns)


def test_a_model_template_cannot_reach_python_internals(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    )
    with pytest.raises(ColibriError, match=r"the model's chat template \(tokenizer_config.json\) failed"):
        ChatTemplate.for_model(tmp_path).render([{"role": "user", "content": "hi"}])


def test_chunks_follow_llama_perplexity():
    tokens = list(range(100, 357))  # 257 tokens: 4 chunks of 64, one token left over
    parts = chunks(tokens, 64, bos=1)
    assert len(parts) == 4
    assert parts[1].tokens == [1] + tokens[65:128]  # BOS replaces the chunk's first token
    assert all(p.score_from == 32 for p in parts)  # logits 32..62 score tokens 33..63: 31 per chunk
    assert len(chunks(tokens, 64, bos=None, limit=2)) == 2 and chunks(tokens, 64, None)[0].tokens == tokens[:64]


def test_perplexity_and_its_error_are_llama_cpps():
    logprobs = [-1.0, -2.0, -3.0, -2.0]
    p = perplexity(logprobs)
    mean = 2.0
    var = (1 + 4 + 9 + 4) / 4 - mean**2
    assert p.ppl == pytest.approx(math.exp(mean)) and p.tokens == 4
    assert p.error == pytest.approx(math.exp(mean) * math.sqrt(var / 3))


@pytest.mark.parametrize("board", ["host", "qemu-rv32"])
def test_eval_scores_every_chunk_on_the_board_bit_for_bit_as_the_reference(builder, board):
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, board)
    tokenizer = Tokenizer.for_model(DEFAULT_MODEL)
    tokens = tokenizer.encode(TEXT)

    def run(request):
        return run_on_board(b, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image)

    ev = evaluate(tokens, plan, tokenizer.bos_id(), run, weights=art.weights, limit=2)
    assert ev.reference_checked and ev.chunks == 2 and ev.result.tokens == 2 * 31
    assert 1.0 < ev.result.ppl < plan.spec.vocab_size / 10  # it learnt this kind of text


def test_eval_says_when_the_text_is_shorter_than_a_chunk(builder):
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64)
    with pytest.raises(ColibriError, match="less than one chunk of 64"):
        evaluate([1, 2, 3], plan, 1, lambda request: None)


def chat_cli(model, tmp_path, *extra, messages=MESSAGES[:1], steps="4"):
    return subprocess.run(
        [str(REPO / "colibri"), "chat", "--model", str(model), "--ctx", "128", "--steps", steps, "--greedy", "--json"]
        + ["--out", str(tmp_path / "build"), *map(str, extra)],
        input="\n".join(messages) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_chat_on_a_gguf_file_without_a_template_says_so_and_builds_nothing(tmp_path):
    done = chat_cli(gemma3_gguf(), tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"colibri: error: {gemma3_gguf()}: the GGUF file has no tokenizer.chat_template; give one with "
        "--chat-template FILE, or use ./colibri run for plain text"
    ]
    assert not (tmp_path / "build").exists()


def test_a_chat_template_file_serves_a_model_that_has_none(tmp_path):
    assert ChatTemplate.for_model(DEFAULT_MODEL) is None
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    done = chat_cli(DEFAULT_MODEL, tmp_path, "--chat-template", template, messages=MESSAGES[:2])
    assert done.returncode == 0, done.stderr
    turns = [json.loads(line) for line in done.stdout.splitlines()]
    tokenizer = Tokenizer.for_model(DEFAULT_MODEL)
    expected = ChatState(ChatTemplate(TEMPLATE), tokenizer, 128, 4).plan_turn(MESSAGES[0]).prompt
    assert turns[0]["prompt"] == expected == tokenizer.encode(f"user:{MESSAGES[0]}\nassistant:", special=False)
    assert [t["user"] for t in turns] == MESSAGES[:2]


def test_a_chat_template_file_comes_before_the_models_own(chat_model, tmp_path):
    template = tmp_path / "brackets.jinja"
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    mine = ChatTemplate.from_file(template, chat_model)
    assert mine.render([{"role": "user", "content": "hi"}]) == "[hi]"
    assert mine.origin == "--chat-template brackets.jinja"
    done = chat_cli(chat_model, tmp_path, "--chat-template", template, steps="2")
    assert done.returncode == 0, done.stderr
    tokenizer = Tokenizer.for_model(chat_model)
    assert json.loads(done.stdout.splitlines()[0])["prompt"] == tokenizer.encode(f"[{MESSAGES[0]}]", special=False)


def test_a_chat_template_file_that_cannot_be_read_is_one_clear_error(tmp_path):
    done = chat_cli(DEFAULT_MODEL, tmp_path, "--chat-template", tmp_path / "missing.jinja")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"colibri: error: --chat-template {tmp_path / 'missing.jinja'}: No such file or directory"
    ]
    (tmp_path / "latin1.jinja").write_bytes(b"caf\xe9")
    done = chat_cli(DEFAULT_MODEL, tmp_path, "--chat-template", tmp_path / "latin1.jinja")
    assert done.returncode != 0 and done.stderr.strip().endswith("latin1.jinja: not UTF-8 text")


# Gemma's turn format, written for these tests in the shape of tokenizer_config.json's chat_template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_the_gemma_file_chats_with_a_template_file(tmp_path):
    gemma = gemma3_gguf()
    template = tmp_path / "gemma.jinja"
    template.write_text(GEMMA_TEMPLATE)
    given = ChatTemplate.from_file(template, gemma)
    assert (given.bos_token, given.eos_token) == ("<bos>", "<eos>")  # the file's own BOS and EOS texts
    done = chat_cli(gemma, tmp_path, "--chat-template", template, messages=["What is the capital of France?"])
    assert done.returncode == 0, done.stderr
    turn = json.loads(done.stdout.splitlines()[0])
    tokenizer = Tokenizer.for_model(gemma)
    text = "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    assert turn["prompt"] == tokenizer.encode(text, special=False)
    assert turn["prompt"][:2] == [2, 105]  # <bos> and <start_of_turn>, each one token


@pytest.mark.parametrize(
    "largest, advice",
    [
        (64, "start a new chat; this board and model allow no larger context than 64"),
        (256, "start a new chat, or build with a larger --ctx, at most 256"),
    ],
)
def test_a_full_context_advises_only_a_context_the_board_and_model_allow(largest, advice):
    state = ChatState(ChatTemplate(TEMPLATE), Tokenizer.for_model(DEFAULT_MODEL), 64, 8, largest_ctx=largest)
    with pytest.raises(ColibriError, match=r"the context is full") as refused:
        state.plan_turn(TEXT)
    assert advice in str(refused.value)
