#!/usr/bin/env python3
"""Train Colibri's bundled default model: a tiny Llama trained on the King James Bible.

Usage (from the repository root):

    .venv/bin/python tools/train_default_model.py --out models/kjv-tiny

Steps:
  1. extract the KJV text with the `bible` command (Debian package bible-kjv)
     and normalise it to one verse per line (no book/chapter/verse references);
  2. train a 512-entry byte-level BPE tokenizer (tokenizers library);
  3. train transformers.LlamaForCausalLM from scratch (fixed architecture that
     fits a 384 KB microcontroller with 8-bit weights), fully deterministically;
  4. save config.json, model.safetensors, generation_config.json, tokenizer.json;
  5. write a model card (README.md) and training_log.json.

Everything except the wall-clock timings is deterministic: a re-run produces
byte-identical tokenizer.json and model.safetensors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Fixed, documented settings ---------------------------------------------------

BIBLE_PACKAGE = "bible-kjv"
BIBLE_RANGE = "Gen1:1-Rev22:21"
BIBLE_COLUMNS = "80"  # `bible` wraps at $COLUMNS; lines are re-joined anyway
EXPECTED_VERSES = 31102
EXPECTED_CHAPTERS = 1189

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # -> ids 0, 1, 2

MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    tie_word_embeddings=True,
    attention_bias=False,
    mlp_bias=False,
)

SAMPLE_PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses",
    "Blessed are the",
]
SAMPLE_NEW_TOKENS = 64
GENERATION_SETTINGS = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.95)


def log(msg: str) -> None:
    print(msg, flush=True)


# 1. Corpus ---------------------------------------------------------------------


def extract_corpus() -> tuple[str, dict]:
    """Run `bible` and return (plain text with one verse per line, info)."""
    exe = shutil.which("bible")
    if exe is None:
        sys.exit(
            "error: the `bible` command (Debian package bible-kjv) was not found; "
            "install it with: apt-get install bible-kjv"
        )
    try:
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", BIBLE_PACKAGE],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        version = "unknown"

    env = dict(os.environ, COLUMNS=BIBLE_COLUMNS, LC_ALL="C")
    proc = subprocess.run([exe, BIBLE_RANGE], capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.exit(
            f"error: `bible {BIBLE_RANGE}` failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()}\ninstall it with: apt-get install bible-kjv"
        )
    raw = proc.stdout

    # Output format:            (blank line)
    #                           Genesis 1
    #                           (blank line)
    #                             1 In the beginning God created ...
    #                           wrapped continuation line
    #                             2 And the earth ...
    header_re = re.compile(r"^(\S.*) (\d+)$")
    verse_re = re.compile(r"^ +(\d+) (.*)$")
    verses: list[list[str]] = []
    chapters: list[tuple[str, int, int]] = []  # (book, chapter, first verse idx)
    expected_verse = None
    prev_blank = True
    for line in raw.split("\n"):
        if not line.strip():
            prev_blank = True
            continue
        m = verse_re.match(line)
        if m:
            if int(m.group(1)) != expected_verse:
                sys.exit(f"error: unexpected verse numbering in `bible` output near: {line!r}")
            expected_verse += 1
            verses.append([m.group(2)])
        elif prev_blank and header_re.match(line):
            h = header_re.match(line)
            chapters.append((h.group(1), int(h.group(2)), len(verses)))
            expected_verse = 1
        elif verses:
            verses[-1].append(line)  # wrapped continuation of the current verse
        else:
            sys.exit(f"error: cannot parse `bible` output line: {line!r}")
        prev_blank = False

    texts = [" ".join(" ".join(parts).split()) for parts in verses]
    if len(texts) != EXPECTED_VERSES or len(chapters) != EXPECTED_CHAPTERS:
        sys.exit(
            f"error: parsed {len(texts)} verses / {len(chapters)} chapters from `bible`, "
            f"expected {EXPECTED_VERSES} / {EXPECTED_CHAPTERS}"
        )
    corpus = "".join(t + "\n" for t in texts)
    info = dict(
        package=BIBLE_PACKAGE,
        package_version=version,
        command=f'COLUMNS={BIBLE_COLUMNS} bible "{BIBLE_RANGE}"',
        raw_sha256=hashlib.sha256(raw.encode("utf-8")).hexdigest(),
        corpus_sha256=hashlib.sha256(corpus.encode("utf-8")).hexdigest(),
        corpus_chars=len(corpus),
        verses=len(texts),
        chapters=len(chapters),
        books=len(dict.fromkeys(c[0] for c in chapters)),
    )
    return corpus, dict(info=info, verses=texts, chapters=chapters)


# 2. Tokenizer --------------------------------------------------------------------


def train_tokenizer(lines: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=False))
    # GPT-2 style byte-level pre-tokenisation without an added prefix space:
    # spaces become part of the following word ("Ġthe"), "\n" is its own token,
    # and decoding a single token id gives its exact text (" the"), which the
    # firmware needs for streaming output.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=[],  # only characters that occur in the corpus
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos_id)],
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"error: tokenizer has {tok.get_vocab_size()} entries, expected {VOCAB_SIZE}")
    return tok


# 3. Data -------------------------------------------------------------------------


def split_corpus(verses: list[str], chapters, holdout_frac: float):
    """Hold out the last whole chapters holding >= holdout_frac of the characters."""
    total = sum(len(v) + 1 for v in verses)
    held = 0
    split_chapter = len(chapters)
    while held < holdout_frac * total:
        split_chapter -= 1
        start = chapters[split_chapter][2]
        end = chapters[split_chapter + 1][2] if split_chapter + 1 < len(chapters) else len(verses)
        held += sum(len(v) + 1 for v in verses[start:end])
    split_verse = chapters[split_chapter][2]
    book, chap, _ = chapters[split_chapter]
    return split_verse, f"{book} {chap}"


def build_stream(tok, verses: list[str]):
    """Token stream of "verse\\n" lines, plus the start offset of every verse."""
    import numpy as np

    encs = tok.encode_batch([v + "\n" for v in verses], add_special_tokens=False)
    lengths = [len(e.ids) for e in encs]
    stream = np.fromiter((i for e in encs for i in e.ids), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return stream, starts


def tiled_windows(stream, starts, body: int):
    """Verse-aligned, non-overlapping windows covering the stream (for evaluation)."""
    import numpy as np

    out = []
    s = int(starts[0])
    n = len(stream)
    while s < n:
        out.append((s, min(s + body, n)))
        nxt = np.searchsorted(starts, s + body, side="left")
        if nxt >= len(starts):
            break
        s = int(starts[nxt])
    return out


def evaluate(model, stream, windows, bos_id: int, batch_size: int = 32) -> float:
    """Mean next-token NLL (nats/token) over the given windows, each prefixed by BOS."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        groups: dict[int, list] = {}
        for a, b in windows:
            groups.setdefault(b - a, []).append(a)
        for length in sorted(groups):
            starts = groups[length]
            for i in range(0, len(starts), batch_size):
                chunk = starts[i : i + batch_size]
                x = torch.empty((len(chunk), length + 1), dtype=torch.long)
                x[:, 0] = bos_id
                for r, a in enumerate(chunk):
                    x[r, 1:] = torch.from_numpy(stream[a : a + length])
                logits = model(input_ids=x).logits[:, :-1]
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
                total += float(loss)
                count += x[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step: int, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# 5. Samples / model card -----------------------------------------------------------


def generate_samples(model_dir: Path, tok, seed: int):
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    eos = tok.token_to_id("</s>")
    out = {"greedy": [], "sampled": []}
    for mode in ("greedy", "sampled"):
        for prompt in SAMPLE_PROMPTS:
            ids = torch.tensor([tok.encode(prompt).ids])
            kwargs = dict(max_new_tokens=SAMPLE_NEW_TOKENS, pad_token_id=eos)
            if mode == "greedy":
                kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
            else:
                torch.manual_seed(seed)
                kwargs.update(GENERATION_SETTINGS)
            with torch.no_grad():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            text = tok.decode(gen[0].tolist(), skip_special_tokens=True)
            out[mode].append(dict(prompt=prompt, text=text))
    return out


def fmt_duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s"


def write_model_card(out: Path, L: dict, samples: dict) -> None:
    c = L["config"]
    t = L["tokenizer"]
    tr = L["training"]
    corp = L["corpus"]

    def block(items):
        lines = []
        for it in items:
            lines.append(f"**Prompt:** `{it['prompt']}`\n")
            lines.append("```text")
            lines.append(it["text"].rstrip("\n"))
            lines.append("```\n")
        return "\n".join(lines)

    per_layer = L["param_count_per_layer"]
    card = f"""# kjv-tiny

Colibri's bundled default model: a tiny Llama-architecture causal language model
trained from scratch on the King James Version of the Bible. It is small enough to
run on a microcontroller with 384 KB of RAM/flash budget when its weights are
quantised to 8 bits, and it produces readable (if not always sensible) Bible-like
English. It is a demo model, not a source of scripture: it invents verses.

Files:

| file | content |
|---|---|
| `config.json` | `LlamaConfig` (transformers {L["versions"]["transformers"]}) |
| `model.safetensors` | float32 weights, Hugging Face names (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ..., `model.norm.weight`); the output head is tied to the embedding, so there is no `lm_head.weight` |
| `generation_config.json` | BOS/EOS ids and the demo's sampling settings |
| `tokenizer.json` | `tokenizers` BPE tokenizer, {t["vocab_size"]} entries |
| `tokenizer_config.json` | lets `transformers.AutoTokenizer` load `tokenizer.json` with its special tokens |
| `training_log.json` | the numbers on this page, machine-readable |

## Architecture

`transformers.LlamaForCausalLM`, float32:

| setting | value |
|---|---|
| vocab_size | {c["vocab_size"]} |
| hidden_size | {c["hidden_size"]} |
| intermediate_size | {c["intermediate_size"]} |
| num_hidden_layers | {c["num_hidden_layers"]} |
| num_attention_heads | {c["num_attention_heads"]} |
| num_key_value_heads | {c["num_key_value_heads"]} (grouped-query / multi-query attention) |
| head_dim | {c["head_dim"]} |
| max_position_embeddings | {c["max_position_embeddings"]} |
| rope_theta | {c["rope_theta"]} (default RoPE, no scaling) |
| rms_norm_eps | {c["rms_norm_eps"]} |
| hidden_act | {c["hidden_act"]} (SwiGLU MLP) |
| tie_word_embeddings | {str(c["tie_word_embeddings"]).lower()} |
| attention_bias / mlp_bias | {str(c["attention_bias"]).lower()} / {str(c["mlp_bias"]).lower()} |
| bos_token_id / eos_token_id | {c["bos_token_id"]} / {c["eos_token_id"]} |

Parameters: **{L["param_count"]:,}** (embedding {L["param_count_embedding"]:,}, shared with
the output head; {per_layer:,} per decoder layer; final norm {c["hidden_size"]}).
That is {L["param_count"] * 4 / 1024:.0f} KiB in float32 and about
{L["param_count"] / 1024:.0f} KiB with 8-bit weights.

The model was trained with sequences of {tr["seq_len"]} tokens; positions
{tr["seq_len"]}..{c["max_position_embeddings"] - 1} are allowed by the config but were
never seen in training, so text quality may degrade when a generation runs past
{tr["seq_len"]} tokens.

## Tokenizer

Byte-level BPE (`tokenizers` {L["versions"]["tokenizers"]}), trained on the whole corpus:

- vocabulary: exactly {t["vocab_size"]} entries, special tokens `<unk>` = {t["unk_id"]},
  `<s>` (BOS) = {t["bos_id"]}, `</s>` (EOS) = {t["eos_id"]}; {t["alphabet_size"]}
  single-character tokens (only characters that occur in the corpus, no 256-byte
  alphabet), the rest are merges; `byte_fallback` off, `min_frequency` 2;
- pre-tokenizer `ByteLevel(add_prefix_space=False, use_regex=True)` and decoder
  `ByteLevel()`: a space is stored as `Ġ` at the start of the following word and a
  newline as `Ċ`, so `decode` reproduces the text exactly, and decoding one id at a
  time (streaming) gives the right spacing (`" the"`);
- post-processor `TemplateProcessing("<s> $A")`: `encode(text).ids` starts with BOS.
  `tokenizer.encode("In the beginning").ids` = `{t["example_ids"]}`
  (`{t["example_tokens"]}`);
- no normalizer: the corpus is plain ASCII.

## Corpus

- Source: the Debian package `{corp["package"]}`, version `{corp["package_version"]}`,
  extracted with `{corp["command"]}`. The King James Version (1611/1769) text is in
  the public domain (outside the United Kingdom, where it is under Crown
  letters patent).
- Book/chapter headers and verse numbers are removed, wrapped lines re-joined and
  runs of spaces collapsed; the result is one verse per line, `\\n`-terminated, in
  canonical order Genesis 1:1 - Revelation 22:21 ({corp["verses"]:,} verses,
  {corp["chapters"]:,} chapters, {corp["books"]} books).
- Size: {corp["corpus_chars"]:,} characters, {corp["corpus_tokens"]:,} tokens
  ({corp["corpus_chars"] / corp["corpus_tokens"]:.2f} characters per token).
- SHA-256 of the extracted text (UTF-8): `{corp["corpus_sha256"]}`.
- Validation split: the last whole chapters, from {tr["val_from"]} to Revelation 22
  ({tr["val_verses"]:,} verses, {tr["val_tokens"]:,} tokens,
  {100 * tr["val_tokens"] / corp["corpus_tokens"]:.1f}% of the tokens); everything
  before it ({tr["train_tokens"]:,} tokens) is training data.

## Training recipe

```sh
{tr["command"]}
```

- Seed {tr["seed"]} for Python `random`, NumPy and PyTorch;
  `torch.set_num_threads(1)`, `torch.use_deterministic_algorithms(True)`. A re-run
  gives byte-identical `tokenizer.json` and `model.safetensors`.
- Examples: `<s>` followed by the {tr["seq_len"] - 1} tokens that start at a
  verse beginning of the training stream ({tr["seq_len"]} tokens per sequence); the
  starting verses are drawn by a seeded NumPy generator (a fresh permutation of all
  {tr["train_windows"]:,} eligible verse starts per pass). Loss is the mean next-token
  cross-entropy over all positions.
- Optimizer: AdamW (betas {tuple(tr["betas"])}, eps {tr["adam_eps"]}, weight decay
  {tr["weight_decay"]} on matrices incl. the tied embedding, 0 on RMSNorm weights),
  gradient clipping at {tr["grad_clip"]}.
- Schedule: linear warm-up for {tr["warmup_steps"]} steps to {tr["peak_lr"]}, then
  cosine decay to {tr["min_lr"]}.
- Batch {tr["batch_size"]} sequences x {tr["seq_len"]} tokens =
  {tr["batch_size"] * tr["seq_len"]:,} tokens per step, {tr["steps"]:,} steps
  ({tr["tokens_seen"]:,} tokens, {tr["tokens_seen"] / tr["train_tokens"]:.1f} passes
  over the training tokens); default Hugging Face initialisation (normal, std
  {c["initializer_range"]}); no dropout.
- Hardware: one CPU thread (PyTorch {L["versions"]["torch"]}); wall time
  {fmt_duration(tr["train_seconds"])} for the training loop
  ({fmt_duration(L["total_seconds"])} for the whole script).

## Results

Mean next-token loss in nats/token over verse-aligned {tr["seq_len"]}-token windows
(each prefixed with `<s>`):

| split | loss (nats/token) | perplexity |
|---|---|---|
| train (every verse-aligned window of the training split) | {tr["final_train_loss"]:.4f} | {math.exp(tr["final_train_loss"]):.2f} |
| validation (held-out chapters) | {tr["final_val_loss"]:.4f} | {math.exp(tr["final_val_loss"]):.2f} |

Running mean of the training loss over the last 100 steps: {tr["last100_train_loss"]:.4f}.

Validation loss during training: {", ".join(f"step {e['step']}: {e['val_loss']:.3f}" for e in tr["val_history"])}.

## Samples

Generated with `transformers` from the saved files; prompts are encoded with
`<s>` prepended, {SAMPLE_NEW_TOKENS} new tokens each.

### Greedy

A model this small soon falls into loops under greedy decoding, which is why the
demo samples.

{block(samples["greedy"])}
### Sampled

`do_sample=True, temperature=0.8, top_k=40, top_p=0.95` (the settings in
`generation_config.json`), `torch.manual_seed({tr["seed"]})` before each prompt.

{block(samples["sampled"])}"""
    (out / "README.md").write_text(card.rstrip("\n") + "\n", encoding="utf-8")


# main --------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory, e.g. models/kjv-tiny")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=6500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-2, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--holdout", type=float, default=0.02, help="fraction of characters held out")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=1000)
    args = ap.parse_args()

    t_script = time.time()
    try:
        import numpy as np
        import tokenizers
        import torch
        import transformers
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        sys.exit(f"error: {e}; run this with the project venv (.venv/bin/python)")
    transformers.utils.logging.disable_progress_bar()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    # 1. corpus
    corpus, c = extract_corpus()
    info = c["info"]
    verses, chapters = c["verses"], c["chapters"]
    log(f"corpus: {info['verses']} verses, {info['corpus_chars']} chars, sha256 {info['corpus_sha256']}")
    log(f"        {info['package']} {info['package_version']}")

    # 2. tokenizer
    tok = train_tokenizer([v + "\n" for v in verses])
    if tok.decode(tok.encode(corpus).ids, skip_special_tokens=True) != corpus:
        sys.exit("error: tokenizer does not round-trip the corpus")
    tok.save(str(out / "tokenizer.json"), pretty=True)
    # Lets transformers.AutoTokenizer load tokenizer.json with its special tokens.
    tok_cfg = dict(
        bos_token="<s>",
        clean_up_tokenization_spaces=False,
        eos_token="</s>",
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        tokenizer_class="PreTrainedTokenizerFast",
        unk_token="<unk>",
    )
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    bos_id, eos_id, unk_id = (tok.token_to_id(s) for s in ("<s>", "</s>", "<unk>"))
    example = tok.encode("In the beginning")
    log(f"tokenizer: vocab {tok.get_vocab_size()}, bos {bos_id}, eos {eos_id}, 'In the beginning' -> {example.ids}")

    # 3. data
    split_verse, val_from = split_corpus(verses, chapters, args.holdout)
    train_stream, train_starts = build_stream(tok, verses[:split_verse])
    val_stream, val_starts = build_stream(tok, verses[split_verse:])
    body = args.seq_len - 1  # + BOS = seq_len
    eligible = train_starts[train_starts + body <= len(train_stream)]
    corpus_tokens = len(train_stream) + len(val_stream)
    log(
        f"data: train {len(train_stream)} tokens ({len(eligible)} windows), "
        f"val {len(val_stream)} tokens from {val_from}"
    )
    val_windows = tiled_windows(val_stream, val_starts, body)
    train_eval_windows = tiled_windows(train_stream, train_starts, body)

    # model
    config = LlamaConfig(**MODEL_CONFIG, bos_token_id=bos_id, eos_token_id=eos_id, dtype="float32")
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.model.embed_tokens.weight.numel()
    n_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    log(f"model: {n_params} parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    betas, adam_eps, grad_clip = (0.9, 0.95), 1e-8, 1.0
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=args.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=args.lr,
        betas=betas,
        eps=adam_eps,
    )

    rng = np.random.default_rng(args.seed)
    order = np.empty(0, dtype=np.int64)
    pos = 0
    offsets = np.arange(body)
    val_history = []
    recent: list[float] = []
    interval_loss, interval_n = 0.0, 0
    t0 = time.time()
    for step in range(args.steps):
        if pos + args.batch_size > len(order):
            order = np.concatenate([order[pos:], rng.permutation(eligible)])
            pos = 0
        batch_starts = order[pos : pos + args.batch_size]
        pos += args.batch_size
        x = np.empty((args.batch_size, args.seq_len), dtype=np.int64)
        x[:, 0] = bos_id
        x[:, 1:] = train_stream[batch_starts[:, None] + offsets[None, :]]
        x = torch.from_numpy(x)

        lr = lr_at(step, args.steps, args.lr, args.warmup, args.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()

        lv = loss.item()
        interval_loss += lv
        interval_n += 1
        recent = (recent + [lv])[-100:]
        done = step + 1
        if done % args.log_every == 0 or done == args.steps or done == 1:
            el = time.time() - t0
            log(
                f"step {done:5d}/{args.steps}  loss {interval_loss / interval_n:.4f}  lr {lr:.2e}  "
                f"{el:6.0f}s  {done * args.batch_size * args.seq_len / el:,.0f} tok/s"
            )
            interval_loss, interval_n = 0.0, 0
        if done % args.eval_every == 0 or done == args.steps:
            vl = evaluate(model, val_stream, val_windows, bos_id)
            val_history.append(dict(step=done, val_loss=round(vl, 4)))
            log(f"step {done:5d}  val loss {vl:.4f}")
    train_seconds = time.time() - t0

    final_val = evaluate(model, val_stream, val_windows, bos_id)
    final_train = evaluate(model, train_stream, train_eval_windows, bos_id)
    log(f"final: train loss {final_train:.4f}  val loss {final_val:.4f}  ({train_seconds:.0f} s)")

    # 4. save
    model.eval()
    for stale in ("model.safetensors", "pytorch_model.bin", "generation_config.json"):
        if (out / stale).exists():
            (out / stale).unlink()
    model.save_pretrained(str(out), safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    # transformers 5 writes "dtype" and "rope_parameters"; also keep the classic
    # top-level keys so that older readers (and simple converters) find them.
    cfg.setdefault("torch_dtype", "float32")
    cfg.setdefault("rope_theta", MODEL_CONFIG["rope_theta"])
    cfg_path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    gen = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, **GENERATION_SETTINGS)
    gen.save_pretrained(str(out))

    # 5. samples, log, model card
    samples = generate_samples(out, tok, args.seed)
    for mode in ("greedy", "sampled"):
        for s in samples[mode]:
            log(f"[{mode}] {s['text']!r}")

    config_dict = {k: v for k, v in MODEL_CONFIG.items()}
    config_dict.update(
        bos_token_id=bos_id, eos_token_id=eos_id, initializer_range=config.initializer_range, torch_dtype="float32"
    )
    total_seconds = time.time() - t_script
    L = dict(
        model="kjv-tiny",
        seed=args.seed,
        config=config_dict,
        param_count=n_params,
        param_count_embedding=n_embed,
        param_count_per_layer=n_layer,
        corpus=dict(info, corpus_tokens=corpus_tokens),
        tokenizer=dict(
            type="BPE",
            pre_tokenizer="ByteLevel(add_prefix_space=False, use_regex=True)",
            decoder="ByteLevel",
            post_processor="TemplateProcessing(<s> $A)",
            vocab_size=tok.get_vocab_size(),
            min_frequency=2,
            byte_fallback=False,
            unk_id=unk_id,
            bos_id=bos_id,
            eos_id=eos_id,
            alphabet_size=sum(1 for t, i in tok.get_vocab().items() if len(t) == 1 and i > 2),
            example_text="In the beginning",
            example_ids=example.ids,
            example_tokens=example.tokens,
        ),
        training=dict(
            command=".venv/bin/python tools/train_default_model.py " + " ".join(sys.argv[1:]),
            seed=args.seed,
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            tokens_seen=args.steps * args.batch_size * args.seq_len,
            optimizer="AdamW",
            betas=list(betas),
            adam_eps=adam_eps,
            weight_decay=args.weight_decay,
            grad_clip=grad_clip,
            peak_lr=args.lr,
            warmup_steps=args.warmup,
            min_lr=args.lr * args.min_lr_ratio,
            schedule="linear warmup + cosine decay",
            holdout_fraction=args.holdout,
            val_from=val_from,
            val_verses=len(verses) - split_verse,
            val_tokens=len(val_stream),
            train_tokens=len(train_stream),
            train_windows=len(eligible),
            final_train_loss=round(final_train, 4),
            final_val_loss=round(final_val, 4),
            last100_train_loss=round(sum(recent) / len(recent), 4),
            val_history=val_history,
            train_seconds=round(train_seconds, 1),
        ),
        total_seconds=round(total_seconds, 1),
        versions=dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            tokenizers=tokenizers.__version__,
            numpy=np.__version__,
        ),
        samples=samples,
    )
    (out / "training_log.json").write_text(json.dumps(L, indent=2) + "\n")
    write_model_card(out, L, samples)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"wrote {out} ({size / 1024:.0f} KiB) in {total_seconds:.0f} s")


if __name__ == "__main__":
    main()
