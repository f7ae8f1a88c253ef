"""Same seed, same draws: the C sampler and generator/numerics/sampling.py agree on every setting."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import f32_bytes, run_harness

from generator.numerics.sampling import GREEDY_BELOW, Rng, SamplingParams, penalized, sample


def test_rng_stream_is_identical_in_c_and_python(harness):
    for seed in (0, 1, 42, 2**64 - 1, 0x9E3779B97F4A7C15):
        raw = run_harness(harness, ["rng", seed, 1000], b"")
        c_u32 = np.frombuffer(raw[:4000], "<u4")
        c_uniform = np.frombuffer(raw[4000:], "<f4")
        rng = Rng(seed)
        assert [rng.next_u32() for _ in range(1000)] == c_u32.tolist()
        assert [float(rng.uniform()) for _ in range(1000)] == c_uniform.tolist()


def test_uniform_draws_cover_zero_to_one():
    rng = Rng(3)
    draws = np.array([rng.uniform() for _ in range(20000)])
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert abs(draws.mean() - 0.5) < 0.01


SETTINGS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=40, seed=2),
    SamplingParams(temperature=1.3, top_p=0.9, seed=3),
    SamplingParams(temperature=0.9, min_p=0.05, seed=4),
    SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02, seed=5),
    SamplingParams(temperature=2.0, top_k=1, seed=6),
]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_c_sampler_draws_what_python_draws(harness, params):
    vocab = 1000
    logits = np.random.default_rng(params.seed).normal(0, 3, vocab).astype(np.float32)
    logits[10] = logits[11] = logits.max()  # a tie: the lower id ranks first
    p = params.as_f32()
    raw = run_harness(
        harness,
        ["sample", vocab, 300, float.hex(p.temperature), p.top_k, float.hex(p.top_p), float.hex(p.min_p), p.seed],
        f32_bytes(logits),
    )
    rng = Rng(p.seed)
    expected = [sample(logits, p, rng) for _ in range(300)]
    assert np.frombuffer(raw, "<i4").tolist() == expected
    assert len(set(expected)) > 1 or p.top_k == 1


def test_greedy_takes_the_lowest_id_among_equal_maxima(harness):
    logits = np.zeros(64, np.float32)
    logits[[5, 9]] = 3.0
    raw = run_harness(harness, ["sample", 64, 3, "0", 0, "1", "0", 0], f32_bytes(logits))
    assert np.frombuffer(raw, "<i4").tolist() == [5, 5, 5]
    assert sample(logits, SamplingParams(), Rng(0)) == 5


def test_filters_restrict_the_candidates():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    rng = Rng(11)
    assert {sample(logits, SamplingParams(1.0, top_k=2), rng) for _ in range(500)} == {0, 1}
    assert {sample(logits, SamplingParams(1.0, top_p=0.79), rng) for _ in range(500)} == {0, 1}
    assert {sample(logits, SamplingParams(1.0, min_p=0.5), rng) for _ in range(500)} == {0, 1}
    assert {sample(logits, SamplingParams(1.0), rng) for _ in range(2000)} == {0, 1, 2, 3}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 511, 512, 513])
def test_greedy_agrees_with_the_reference_on_ties_signed_zeros_and_nans_at_every_length(harness, n):
    cases = [np.zeros(n, np.float32), np.full(n, -np.inf, np.float32)]
    for seed in range(6):
        r = np.random.default_rng(seed)
        x = r.choice(np.array([-1.0, -0.0, 0.0, 2.0, 7.0], np.float32), n)
        if seed % 2 and n > 1:
            x[r.integers(1, n)] = np.nan  # a NaN after the start is never larger
        cases.append(x)
    nan_first = np.ones(n, np.float32)
    nan_first[0] = np.nan
    cases.append(nan_first)
    for logits in cases:
        raw = run_harness(harness, ["sample", n, 1, "0", 0, "1", "0", 0], f32_bytes(logits))
        assert np.frombuffer(raw, "<i4").tolist() == [sample(logits, SamplingParams(), Rng(0))]


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 1e-6, 9.99e-4, 0.0])
def test_a_temperature_too_small_to_divide_by_is_greedy_in_c_and_python_alike(harness, temperature):
    """Logits divided by a subnormal temperature overflow to infinity, where C and NumPy used to pick
    different tokens; below the threshold both take the argmax."""
    logits = np.random.default_rng(11).normal(0, 3, 200).astype(np.float32)
    logits[:7] = 50.0  # far above the rest: divided by a tiny temperature, they all become inf
    p = SamplingParams(temperature=temperature, seed=3).as_f32()
    raw = run_harness(
        harness, ["sample", logits.size, 20, float.hex(p.temperature), 0, "1", "0", p.seed], f32_bytes(logits)
    )
    rng = Rng(p.seed)
    expected = [sample(logits, p, rng) for _ in range(20)]
    assert np.frombuffer(raw, "<i4").tolist() == expected == [0] * 20


def test_at_the_threshold_sampling_begins():
    logits = np.zeros(4, np.float32)
    rng = Rng(1)
    draws = {sample(logits, SamplingParams(temperature=float(GREEDY_BELOW), seed=1), rng) for _ in range(64)}
    assert len(draws) > 1  # equal logits at the threshold temperature: a real draw, not the argmax


PENALTIES = [
    SamplingParams(repeat_penalty=1.3, repeat_last_n=64),  # greedy: llama.cpp penalizes before the argmax too
    SamplingParams(temperature=0.8, top_k=40, seed=8, repeat_penalty=1.1, repeat_last_n=16),
    SamplingParams(temperature=1.0, seed=9, repeat_penalty=0.7, repeat_last_n=200),  # below 1: repeats favoured
]


@pytest.mark.parametrize(
    "params", PENALTIES, ids=lambda p: f"T{p.temperature}-penalty{p.repeat_penalty}-n{p.repeat_last_n}"
)
def test_c_and_python_penalize_repeated_tokens_alike(harness, params):
    """The same float32 division or multiplication, once per distinct token of the window, in C and
    NumPy: the same draws, and the penalty changes what is drawn."""
    vocab = 300
    rng = np.random.default_rng(params.seed + 1)
    logits = rng.normal(0, 2, vocab).astype(np.float32)
    logits[:8] = [9.0, 8.9, 0.0, -0.0, -3.0, np.float32(1e-30), 8.8, 8.7]  # near ties, zeros and a negative
    # The window's end holds repeats and ids out of range.
    seen = [*rng.integers(0, vocab, 150).tolist(), 0, 1, 2, 3, 4, 5, 0, 0, 1, vocab + 3, -1]
    p = params.as_f32()
    raw = run_harness(
        harness,
        ["sample", vocab, 200, float.hex(p.temperature), p.top_k, float.hex(p.top_p), float.hex(p.min_p), p.seed]
        + [float.hex(p.repeat_penalty), p.repeat_last_n, len(seen)],
        f32_bytes(logits) + np.asarray(seen, "<i4").tobytes(),
    )
    draw = Rng(p.seed)
    expected = [sample(logits, p, draw, seen) for _ in range(200)]
    assert np.frombuffer(raw, "<i4").tolist() == expected
    plain = Rng(p.seed)
    assert expected != [sample(logits, replace(p, repeat_penalty=1.0), plain, seen) for _ in range(200)]


def test_the_penalty_divides_positive_logits_multiplies_the_rest_once_per_token_in_the_window():
    logits = np.array([2.0, -2.0, 0.0, 4.0, 3.0], np.float32)
    p = SamplingParams(repeat_penalty=2.0, repeat_last_n=4)
    # The window is the last 4 tokens: 4 is out of it; 0 is seen twice but divided once.
    assert penalized(logits, p, [4, 0, 1, 0, 2]).tolist() == [1.0, -4.0, 0.0, 4.0, 3.0]
    assert penalized(logits, replace(p, repeat_last_n=0), [0]).tolist() == logits.tolist()  # 0: off
    assert penalized(logits, replace(p, repeat_penalty=1.0), [0]).tolist() == logits.tolist()  # 1: off
    assert sample(logits, p, Rng(0), [3]) == 4 and sample(logits, p, Rng(0), []) == 3
