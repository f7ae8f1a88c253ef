"""tokenizer_config.json's clean_up_tokenization_spaces: the text decoded is transformers' decode
(the oracle), which with it set takes out the space before punctuation and English contractions
(" ." " ," " 's" " n't" ...), except for a BPE model unless its config insists; the text streamed
as tokens arrive ends up the same text."""

from __future__ import annotations

import json

import pytest

from generator.console import TextStream
from generator.model.tokenizer import Tokenizer

WORDS = ["[UNK]", "I", "do", "n't", "'m", "'s", "'ve", "'re", "it", "so", ".", ",", "?", "!", "'", "Bob", "cat"]
# Texts whose words are joined with spaces by the tokenizer's decode, so that clean-up has work.
SENTENCES = [
    "I do n't so it .",
    "Bob 's cat , so it 's !",
    "I 'm so ? I 've it , I 're .",
    "so ' it ' so",
]


def tiny_tokenizer(folder, model: str, config: dict):
    """A word-level or BPE tokenizer (no merges, so every word of WORDS a token) split on spaces,
    with tokenizer_config.json `config`."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    if model == "WordLevel":
        tok = HFTokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    else:  # each word merged from its letters, left to right
        pieces = list(dict.fromkeys([c for word in WORDS[1:] for c in word]))
        merges = [(word[:i], word[i]) for word in WORDS[1:] for i in range(1, len(word))]
        pieces += list(dict.fromkeys(a + b for a, b in merges if a + b not in pieces))
        vocab = {piece: i for i, piece in enumerate(["[UNK]", *pieces])}
        tok = HFTokenizer(models.BPE(vocab, list(dict.fromkeys(merges)), unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    return folder


BPE_FORCED = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


@pytest.mark.parametrize("model", ["WordLevel", "BPE"])
@pytest.mark.parametrize(
    "config",
    [{}, {"clean_up_tokenization_spaces": False}, {"clean_up_tokenization_spaces": True},
     {"clean_up_tokenization_spaces": True, BPE_FORCED: True}],
    ids=["unset", "false", "true", "true-forced-for-bpe"],
)  # fmt: skip
def test_decoded_text_is_transformers_decode(model, config, tmp_path):
    import transformers

    folder = tiny_tokenizer(tmp_path / "tok", model, config)
    oracle = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer.for_model(folder)
    cleaned = 0
    for sentence in SENTENCES:
        ids = ours.encode(sentence)
        assert ids == oracle.encode(sentence)
        expected = oracle.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids) == expected, (sentence, config)
        cleaned += expected != sentence
    # The cases where transformers cleans up are the ones that test it.
    assert bool(cleaned) == bool(
        config.get("clean_up_tokenization_spaces") and (model != "BPE" or BPE_FORCED in config)
    )


def test_streamed_text_is_the_cleaned_up_text(tmp_path, capsys):
    """A space shown before the token that takes it out could not be taken back: the stream holds
    back the end of the text a later token may still change, and shows it when the line ends."""
    tok = Tokenizer.for_model(tiny_tokenizer(tmp_path / "tok", "WordLevel", {"clean_up_tokenization_spaces": True}))
    for sentence in SENTENCES:
        ids = tok.encode(sentence)
        stream = TextStream(tok, enabled=True)
        for step, token in enumerate(ids):
            stream(step, token)
        stream.end_line()
        assert capsys.readouterr().out == tok.decode(ids) + "\n"
