"""bench's token stream on a MoE model is a user's (issue 23): a text teacher-forced one token per
forward pass, or sampled decoding, never the synthetic prompt and greedy loop whose routing repeats;
under a budget its hit rate is what a run with the same text gets, and it is compared with the same
stream run without a budget.

The model: kjv-tiny upcycled into a Mixtral of 16 experts, top-2 (tests/models.py): it writes
KJV-like text, so a sampled run's stream routes like the bundled text does."""

import json
import statistics

import pytest
from cli_runs import main_json
from conftest import run_cli

from generator import bench
from generator.compile.cache_plan import cache_plan
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, cache_stats
from generator.model.tokenizer import Tokenizer
from generator.verify import reference_run

pytestmark = pytest.mark.slow  # benchmarks while the image streams

CTX = 256


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from models import make_upcycled_moe

    return make_upcycled_moe(tmp_path_factory.mktemp("moe") / "kjv-moe16", experts=16, top_k=2)


@pytest.fixture(scope="module")
def built(builder, moe):
    board, art, plan = builder.build(moe, "q8_0", CTX)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    # The smallest pool LRU runs with: top-k slots per MoE layer.
    return board, art, plan, c.budget_for(c.experts_per_token * c.n_moe_layers)


def bench_json(capsys, moe, art, *args) -> dict:
    from generator.cli import main

    assert main(["bench", "--model", str(moe), "--ctx", str(CTX), "--out", str(art.out_dir), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def bench_run(capsys, monkeypatch, moe, art, *args) -> tuple[dict, bench.BenchResult]:
    """bench --json's document, and the result it was written from (for bench_line)."""
    from generator import job

    made: list[bench.BenchResult] = []
    bench_built = job.bench_built

    def recorded(*a, **k) -> bench.BenchResult:
        made.append(bench_built(*a, **k))
        return made[-1]

    monkeypatch.setattr(job, "bench_built", recorded)
    return bench_json(capsys, moe, art, *args), made[-1]


def once_under(budget: int) -> list[str]:
    """bench's options for one run under the budget, without the in-RAM comparison."""
    return ["--repeat", "1", "--memory-budget", str(budget), "--no-in-ram"]


def hit_rate(stats: dict) -> float:
    return stats["cache_hits"] / (stats["cache_hits"] + stats["cache_misses"])


def test_repetition_is_the_share_of_n_grams_seen_before():
    assert bench.repetition(list(range(40))) == 0
    assert bench.repetition([7, 8] * 20) == pytest.approx(1 - 2 / 37)
    assert bench.repetition([1, 2, 3]) is None


def test_the_text_stream_decodes_one_token_per_forward_pass_the_texts_not_the_models(built, moe):
    board, art, plan, budget = built
    tokens = Tokenizer.for_model(moe).encode(bench.read_text(bench.DEFAULT_TEXT))
    stream, steps = bench.make_stream(plan, Tokenizer.for_model(moe), None, None, bench.SAMPLED, 8, 40)
    assert stream.kind == "text" and stream.prompt == tokens[:8] and stream.forced == tokens[8:47]
    request = RunRequest(
        stream.request_prompt(steps),
        steps,
        stop_at_eos=False,
        memory_budget=budget,
        decode_from=stream.decode_from(steps),
    )
    result = run_on_board(board, art.program, art.weights, request, art.model_hash())
    # 8 prompt tokens prefilled; 39 decode passes, each fed the text's next token.
    assert result.stats["prompt"] == "8" and result.stats["decode"] == "39"
    assert result.tokens[:39] == tokens[8:47]
    # The expert cache counted every one of them in the decode: k uses per MoE layer per pass.
    c = cache_stats(result)
    assert c.cache_hits + c.cache_misses == 39 * plan.spec.experts_per_token * sum(map(bool, plan.spec.moe_layers))
    # The same bits as the reference decoding the same request token by token.
    ref = reference_run(plan, art.weights, request)
    assert (result.tokens, result.digests, result.expert_counts) == (ref.tokens, ref.digests, ref.expert_counts)


def test_bench_on_a_moe_model_feeds_the_bundled_text_which_does_not_repeat(built, moe, capsys, monkeypatch):
    board, art, plan, budget = built
    out, result = bench_run(capsys, monkeypatch, moe, art, *once_under(budget))
    s = out["stream"]
    assert s["kind"] == "text" and s["text"].endswith("docs/texts/ruth-kjv.txt")
    assert s["prompt_tokens"] == out["prompt_tokens"] == 8 and s["decoded_tokens_fed"] == out["decode_steps"] - 1
    assert s["repeated_4grams"] < 0.05 and s["distinct_tokens"] > 60
    # Routing follows it: every layer used far more experts than the two a token takes.
    assert s["experts_per_token"] == 2 and min(s["experts_used_per_layer"].values()) >= 12
    # The old stream, still there by name, is the one that repeats, and bench says so.
    old, old_result = bench_run(capsys, monkeypatch, moe, art, *once_under(budget), "--stream", "synthetic")
    assert old["stream"]["kind"] == "synthetic" and old["stream"]["repeated_4grams"] > 0.3
    assert "it REPEATS" in bench.bench_line(old_result, "m") and "REPEATS" not in bench.bench_line(result, "m")


def test_the_hit_rate_bench_reports_is_what_a_run_with_the_same_text_gets(built, moe, capsys, tmp_path):
    board, art, plan, budget = built
    out = bench_json(capsys, moe, art, *once_under(budget))
    # A user's run: the text's opening as the prompt, the model's own sampling, three seeds.
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(bench.read_text(bench.DEFAULT_TEXT)[:300])
    runs = []
    for seed in (0, 1, 2):
        summary = main_json(
            capsys, "run", model=moe, ctx=CTX, out=art.out_dir, prompt_file=prompt, steps=128, ignore_eos=True,
            seed=seed, memory_budget=budget,
        )  # fmt: skip
        runs.append(hit_rate(summary["stats"]["weights_held"]))
    user = statistics.median(runs)
    assert abs(out["cache"]["hit_rate"] - user) <= 0.05, (out["cache"]["hit_rate"], runs)
    # The synthetic prompt and greedy loop would not have been: it hits far more often.
    old = bench_json(capsys, moe, art, *once_under(budget), "--stream", "synthetic")
    assert old["cache"]["hit_rate"] - user > 0.05, (old["cache"]["hit_rate"], runs)


def test_the_sampled_stream_is_what_run_decodes_with_the_same_settings(built, moe, capsys):
    board, art, plan, budget = built
    out = bench_json(capsys, moe, art, *once_under(budget), "--stream", "sampled", "--seed", "4", "--steps", "64")
    s = out["stream"]
    # kjv-tiny's generation_config.json samples (temperature 0.8, top-k 40, top-p 0.95): bench takes it.
    assert s["kind"] == "sampled" and s["sampling"]["seed"] == 4 and s["sampling"]["top_k"] == 40
    assert s["repeated_4grams"] < 0.1
    prompt = ",".join(map(str, bench.synthetic_prompt(plan, 8)))
    summary = main_json(
        capsys, "run", model=moe, ctx=CTX, out=art.out_dir, prompt_ids=prompt, steps=64, ignore_eos=True, seed=4,
        memory_budget=budget,
    )  # fmt: skip
    held = summary["stats"]["weights_held"]
    assert out["cache"]["cache_hits"] == held["cache_hits"] and out["cache"]["cache_misses"] == held["cache_misses"]


def test_bench_json_under_a_budget_has_the_cache_the_bounds_and_the_in_ram_speed(built, moe, capsys, monkeypatch):
    board, art, plan, budget = built
    out, result = bench_run(
        capsys, monkeypatch, moe, art, "--repeat", "2", "--memory-budget", str(budget), "--steps", "48"
    )
    c, ram = out["cache"], out["in_ram"]
    assert 0 < c["hit_rate"] < 1 and c["read_bytes_per_token"] > 0 and c["read_wait_ms_per_token"] >= 0
    assert c["decode_tok_s"] == out["decode_tok_s"] > 0
    assert c["storage_read_bytes_s"] > 0
    assert c["storage_bound_tok_s"] == pytest.approx(c["storage_read_bytes_s"] / c["read_bytes_per_token"])
    # The same stream without a budget, once after each budgeted run.
    assert len(ram["runs"]) == 2 and all(r > 0 for r in ram["runs"])
    assert c["in_ram_tok_s"] == ram["decode_tok_s"] == statistics.median(ram["runs"])
    pairs = [a["decode_tok_s"] / b for a, b in zip(out["runs"], ram["runs"])]
    assert c["of_in_ram"] == ram["of_in_ram"] == pytest.approx(statistics.median(pairs))
    # The tighter of the two limits, and the share of it reached.
    assert c["bound_tok_s"] == min(c["storage_bound_tok_s"], c["in_ram_tok_s"])
    assert c["limited_by"] == ("storage" if c["storage_bound_tok_s"] < c["in_ram_tok_s"] else "compute")
    assert c["of_bound"] == pytest.approx(c["decode_tok_s"] / c["bound_tok_s"])
    line = bench.bench_line(result, "kjv-moe16")
    assert "ruth-kjv.txt teacher-forced" in line and "in RAM (the same stream without the budget" in line


def test_bench_without_a_budget_runs_no_in_ram_comparison(built, moe, capsys):
    board, art, plan, budget = built
    out = bench_json(capsys, moe, art, "--repeat", "1", "--steps", "16")
    assert out["stream"]["kind"] == "text" and out["in_ram"] is None and len(out["runs"]) == 1


@pytest.mark.parametrize(
    "content,fragment",
    [
        (None, "No such file or directory"),
        (b"", "the file is empty"),
        (b" \n\n", "the file is empty"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "a binary file"),
        (b"\xff\xfe\x00\x00 caf\xe9", "a binary file"),
        (b"caf\xe9 latin-1", "not UTF-8 text"),
    ],
)
def test_a_missing_empty_or_binary_text_is_one_line_and_exit_2(moe, tmp_path, content, fragment):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out"
    done = run_cli("bench", "--model", moe, "--ctx", CTX, "--out", out, "--text", path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"colibri: error: --text {path}: ") and fragment in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not out.exists(), "refused before building"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--text", "README.md", "--stream", "synthetic"], "--text feeds a text, and --stream synthetic does not"),
        (["--stream", "text", "--seed", "3"], "--seed set the sampled stream, not --stream text's"),
        (["--temperature", "0"], "--temperature 0 is greedy decoding, which repeats"),
        (["--text", "README.md", "--steps", "250", "--prompt-tokens", "8"], None),
    ],
)
def test_contradicting_stream_options_are_refused_before_building(moe, tmp_path, args, fragment):
    out = tmp_path / "out"
    done = run_cli("bench", "--model", moe, "--ctx", CTX, "--out", out, *args)
    if fragment is None:  # README.md is long enough: refused only by the context, not by the text
        assert "need a context of 257" in done.stderr
    else:
        assert fragment in done.stderr
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and not out.exists()


def test_a_text_shorter_than_the_stream_is_refused_with_the_numbers(moe, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("And Naomi said unto her two daughters in law")
    done = run_cli("bench", "--model", moe, "--ctx", CTX, "--out", tmp_path / "out", "--text", path, "--steps", "100")
    assert done.returncode == 2
    assert "-token prompt and 100 steps need 107: give a longer text, fewer --steps" in done.stderr
