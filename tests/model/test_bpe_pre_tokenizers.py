"""Byte-level BPE vocabularies from GGUF files with the pre-tokenizers DeepSeek, Kimi and GLM files
name (deepseek-llm, deepseek-v3, kimi-k2, glm4), tokenized as llama.cpp tokenizes them.

The oracle is llama.cpp's own llama-tokenize: tools/bpe_golden.py ran it (no BOS, special tokens
parsed, the text's bytes verbatim) over every line of tests/data/spm_corpus.txt and
tests/data/bpe_corpus.txt and each whole file, with a byte-level BPE learnt from that corpus
(tests/data/bpe_vocab.json) in a GGUF file per pre-tokenizer. The ids are committed; these tests
need neither llama-tokenize nor the network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from gguf_files import bpe_vocab_gguf

from generator.errors import ColibriError
from generator.model.gguf.tokenizer import PRE_TOKENIZERS, split
from generator.model.tokenizer import Tokenizer

DATA = REPO / "tests" / "data"
VOCAB = json.loads((DATA / "bpe_vocab.json").read_text(encoding="utf-8"))
CORPORA = ("spm_corpus.txt", "bpe_corpus.txt")
PRES = ["deepseek-llm", "deepseek-v3", "kimi-k2", "glm4"]


def golden(pre: str) -> list[dict]:
    data = json.loads((DATA / f"bpe_golden_{pre}.json").read_text(encoding="utf-8"))
    assert (data["pre"], data["corpus"]) == (pre, list(CORPORA))
    return data["cases"]


def vocab_file(tmp_path: Path, pre: str) -> Path:
    return bpe_vocab_gguf(tmp_path / f"bpe-{pre}.gguf", VOCAB, pre)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    tmp = tmp_path_factory.mktemp("bpe-pre")
    return {pre: Tokenizer.for_model(vocab_file(tmp, pre)) for pre in PRES}


def corpus_cases() -> list[str]:
    """Every line of each corpus file and the whole file (carriage returns kept)."""
    cases = []
    for name in CORPORA:
        with open(DATA / name, encoding="utf-8", newline="") as f:
            text = f.read()
        cases += [*text.split("\n"), text]
    return cases


def test_the_golden_data_covers_the_corpus_and_what_it_is_there_for():
    texts = [c["text"] for c in golden("deepseek-v3")]
    assert texts == corpus_cases()
    joined = "\n".join(texts)
    needed = ["1 12 123 1234 12345", "中文", "カタカナ", "한국어", "👩‍💻", "  ", "\t\t", "it's IT'S", "def ", "\r\n"]
    for text in needed:
        assert text in joined, text
    tokens, types = VOCAB["tokens"], VOCAB["types"]
    for pre in PRES:
        ids = {i for c in golden(pre) for i in c["ids"]}
        assert any(types[i] == 3 for i in ids), f"{pre}: no case spells a control token"
        assert any(types[i] == 4 for i in ids), f"{pre}: no case spells the user-defined token"
        assert any(len(tokens[i]) > 3 and types[i] == 1 for i in ids), f"{pre}: no case needs a merge"
    # A token no merge reaches is taken whole only by glm4, which takes a piece that is a token whole.
    whole = tokens.index("Ġquizzical")
    assert [pre for pre in PRES if any(whole in c["ids"] for c in golden(pre))] == ["glm4"]


@pytest.mark.parametrize("pre", PRES)
def test_the_ids_are_llama_tokenizes(pre, tokenizers):
    tok = tokenizers[pre]
    wrong = [(c["text"], c["ids"]) for c in golden(pre) if tok.encode(c["text"], special=False) != c["ids"]]
    assert wrong == []


def test_the_pre_tokenizers_cut_digits_as_llama_cpp_does():
    def pieces(pre: str, text: str) -> list[str]:
        return [text[a:b] for a, b in split(text, PRE_TOKENIZERS[pre].llama_splits)]

    assert pieces("deepseek-llm", "x 1234567") == ["x", " ", "1234567"]
    assert pieces("deepseek-v3", "x 1234567") == ["x", " ", "123", "456", "7"]
    assert pieces("kimi-k2", "x 1234567") == ["x", " ", "123", "456", "7"]
    # Kimi-K2: Han runs apart from the letters around them, kana with them.
    assert pieces("kimi-k2", "abc中文def かな") == ["abc", "中文", "def", " かな"]


@pytest.mark.parametrize("pre", PRES)
def test_decode_gives_the_text_back(pre, tokenizers):
    tok = tokenizers[pre]
    specials = [t for t, k in zip(VOCAB["tokens"], VOCAB["types"]) if k != 1]
    lines = [c["text"] for c in golden(pre) if not any(s in c["text"] for s in specials)]
    assert len(lines) >= 100
    assert [line for line in lines if tok.decode(tok.encode(line, special=False)) != line] == []


def test_an_unknown_pre_tokenizer_is_one_line_naming_the_supported_ones(tmp_path):
    with pytest.raises(ColibriError) as caught:
        Tokenizer.for_model(vocab_file(tmp_path, "deepseek-v4"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("bpe-deepseek-v4.gguf: unsupported pre-tokenizer 'deepseek-v4' (supported: ")
    assert all(pre in message for pre in PRES)
