"""bench's runs: the built firmware run --repeat times on its board (probing the read bandwidth
next to each run on Linux boards, the same stream without a budget after each budgeted run), and
its figures gathered into a BenchResult."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..boards import Board
from ..compile.cache_plan import AutoElsewhere, CachePlan, RankBudget
from ..compile.plan import Plan
from ..device.links import Firmware, LinkOptions
from ..device.remote import Remote, remote_prefix
from ..device.runner import run_firmware
from ..device.session import RunRequest, RunResult, cache_stats, check_fits_context
from ..sizes import AutoBudget
from ..verify import speed_text
from .cost import macs_per_token, weight_bytes_per_token
from .figures import (
    CacheSummary,
    RunFigures,
    bound_figures,
    cache_summary,
    in_ram_summary,
    remote_summary,
    run_figures,
)
from .plot import check_plot, plot_runs
from .result import BenchResult, clocked_figures, counted_figures
from .stream import Stream, check_forced, stream_figures

# The firmware sizes the probe's buffer itself, from the caches of the machine it runs on: twice the
# largest, at least 256 MiB (firmware_src/bsp/linux/read_probe.c).
PROBE_MIB = 0


def in_ram_fits(image: Path) -> str | None:
    """Why the in-RAM comparison cannot run here (the image exceeds the memory available), or None."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
    except (OSError, ValueError):
        return None
    available, size = info.get("MemAvailable"), os.path.getsize(image)
    if available is not None and size > available:
        return (
            f"skipped: the weight image ({size / 1e9:.2f} GB) exceeds the memory available here "
            f"({available / 1e9:.2f} GB), so a run without a budget would not run in RAM"
        )
    return None


def probes_bandwidth(board: Board, remote: Remote | None = None) -> bool:
    """Whether bench has the firmware measure the read bandwidth next to each run: on Linux boards
    that run natively, here or on a board reached over SSH (the probe runs in the firmware, so on
    the board). Under an emulator (linux-aarch64 on this x86 machine, or a remote prefix) the figure
    would be the emulator's, not the board's; MCUs report instruction counts instead."""
    if not board.runner.probes_bandwidth:
        return False
    return not remote_prefix(board) if remote is not None else not board.runner.needs_emulator()


STORAGE_PROBE_MIB = 256  # of the image file, at most: read with O_DIRECT (or after dropping it from the page cache)


DEFAULT_REPEAT = 3


def default_repeat(board: Board) -> int:
    """Runs to take the median of: one where the count is exact (the same on every run)."""
    return 1 if board.runner.counts_instructions_exactly() else DEFAULT_REPEAT


@dataclass(frozen=True)
class BenchRuns:
    """What a bench decodes, for how many steps, with how many threads and drafted tokens
    (speculate), and how many times."""

    stream: Stream
    steps: int
    repeat: int
    threads: int = 1
    speculate: int = 0


def run_bench(
    board: Board,
    plan: Plan,
    firmware: Firmware,
    how: LinkOptions,
    runs_of: BenchRuns,
    *,
    model: str,
    plot: Path | None = None,
    cache: CachePlan | AutoElsewhere | RankBudget | None = None,
    in_ram: bool = True,
) -> BenchResult:
    """Run the built `firmware`, reached as `how` says, `runs_of.repeat` times and return bench's
    figures. On Linux boards run natively, each run first has the firmware probe the read bandwidth
    with the same threads: probe, decode, probe, decode... Under an emulator every wall-clock figure
    is labelled as the emulator's (`emulated_by`), and there is no bandwidth share. A MoE model
    under a budget also runs the same stream without one after each run (`in_ram`), for the speed
    the budget costs."""
    stream, steps, repeat, threads = runs_of.stream, runs_of.steps, runs_of.repeat, runs_of.threads
    remote, progress = how.remote, how.progress
    prompt = stream.prompt
    check_fits_context(prompt, steps, plan.n_ctx)
    check_plot(board, plot, steps)
    budget = cache.firmware_budget if cache is not None else 0
    request = bench_request(stream, steps, threads, budget, probes_bandwidth(board, remote), runs_of.speculate)
    compare = bool(budget and plan.spec.n_experts and in_ram)
    skipped = in_ram_fits(firmware.weights) if compare and remote is None else None
    ram_request = replace(request, memory_budget=0, probe_storage_mib=None) if compare and not skipped else None
    weight_bytes = weight_bytes_per_token(plan)
    macs = macs_per_token(plan)
    results, ram_results = [], []

    def run(req: RunRequest) -> RunResult:
        result = run_firmware(board, firmware, how, req)
        check_forced(stream, req, result)
        return result

    for i in range(repeat):
        result = run(request)
        results.append(result)
        if progress:
            progress(run_line(i, repeat, run_figures(result, weight_bytes, board, request), bool(budget)))
        if ram_request is not None:
            ram_results.append(run(ram_request))
            if progress:
                progress(
                    f"  run {i + 1}/{repeat} without the budget: "
                    f"{speed_text(run_figures(ram_results[-1], weight_bytes, board, ram_request).run)}"
                )
    runs = [run_figures(r, weight_bytes, board, request, plan) for r in results]
    ram_runs = [run_figures(r, weight_bytes, board, ram_request) for r in ram_results if ram_request is not None]
    kernels = results[-1].hello.get("kernels", "?")
    # Under an emulator here, or on a board over SSH behind a prefix (an emulator, in the tests).
    emulator = (remote_prefix(board)[0] if remote_prefix(board) else None) if remote else board.runner.emulated_by()
    in_ram_figures = in_ram_summary(runs, ram_runs, skipped)
    cache_medians = cache_summary(runs)
    last_stats = cache_stats(results[-1])
    counted, clocked = None, None
    if runs[0].run.decode_instructions_per_token:
        counted = counted_figures(plan, board, runs[0].run, len(prompt), steps, weight_bytes)
    else:
        clocked = clocked_figures(results, runs, weight_bytes)
    out = BenchResult(
        board=board.name,
        model=model,
        architecture=plan.spec.architecture,
        quant=plan.quant,
        n_ctx=plan.n_ctx,
        threads=threads,
        kernels=kernels,
        prompt_tokens=len(prompt),
        decode_steps=steps,
        repeat=repeat,
        emulated_by=emulator,
        speed_note=f"measured under {emulator}: the emulator's speed, not the board's" if emulator else None,
        weight_bytes_per_token=weight_bytes,
        macs_per_token=macs,
        runs=runs,
        memory_budget=cache.as_run(last_stats.auto_ran() if last_stats else None) if cache is not None else None,
        stream=stream_figures(stream, request, results[-1], plan, steps),
        cache=CacheSummary(cache_medians, bound_figures(cache_medians, in_ram_figures, runs) if budget else None)
        if cache_medians is not None
        else None,
        in_ram=in_ram_figures,
        remote=remote_summary(results),
        counted=counted,
        clocked=clocked,
    )
    if plot is None:
        return out
    title = (
        f"{plan.spec.name} on {board.name}: {plan.quant}, {kernels} kernels, "
        f"{threads} thread(s), median of {repeat} runs"
    )
    plot_runs(plot, len(prompt), results, title, progress)
    return replace(out, plot=str(plot))


def bench_request(
    stream: Stream, steps: int, threads: int, budget: int | AutoBudget, probes: bool, speculate: int
) -> RunRequest:
    """The request every run of a bench sends: no logits hashes (the bench measures decoding, not
    verification). Without a budget the firmware probes the memory read bandwidth just before
    decoding; under one it measures how fast its image file reads instead: the memory probe's
    buffer (256 MiB or more) would break the budget it runs under."""
    return RunRequest(
        stream.request_prompt(steps),
        steps,
        stream.sampling,
        stop_at_eos=False,
        threads=threads,
        digests=False,
        probe_bandwidth_mib=PROBE_MIB if probes and not budget else None,
        memory_budget=budget,
        probe_storage_mib=STORAGE_PROBE_MIB if budget and probes else None,
        decode_from=stream.decode_from(steps),
        speculate=speculate,
    )


def run_line(i: int, repeat: int, r: RunFigures, budgeted: bool) -> str:
    """The progress line of run i: its speed, the bandwidth probed just before, the expert cache."""
    probe = (
        f", read bandwidth {r.read_bandwidth_bytes_s / 1e9:.1f} GB/s just before" if r.read_bandwidth_bytes_s else ""
    )
    c = r.cache
    cached = (
        f"; expert cache {100 * c.hit_rate:.0f}% hits, {c.read_bytes_per_token / 1e6:.2f} MB read per token"
        if c and c.hit_rate is not None and budgeted
        else ""
    )
    return f"  run {i + 1}/{repeat}: {speed_text(r.run)}{probe}{cached}"
