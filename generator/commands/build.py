"""build, report, clean and boards: a firmware for a board and a model, where its bytes go, the
build directories, the boards there are."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from .. import job
from ..arguments import add_budget_arg, add_cache_arg, add_compiled_args, add_ranks_arg
from ..boards import Board, available_boards, load_board
from ..compile.build import build_dirs, remove_builds
from ..compile.build_cache import empty_cache, resolve_cache_dir
from ..documents import JsonDocument, json_field
from ..errors import ColibriError
from ..job import compile_build, plan_build
from ..report import format_report, report_problem
from .common import Command, add_json_arg, job_options, print_json


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    add_ranks_arg(p)


@dataclass(frozen=True)
class BuildSummary(JsonDocument):
    """build --json's document: the firmware's files, its model hash and what it was built for; on
    ESP-IDF boards the generated project and whether idf.py built it here."""

    board: str
    program: Path
    weights: Path
    plan: Path
    generated: Path
    model_hash: str
    quant: str
    n_ctx: int
    idf_project: Path | None = json_field(omit_none=True, default=None)
    idf_built: bool | None = json_field(omit_none=True, default=None)
    rank_weights: list[Path] | None = json_field(omit_none=True, default=None)  # each MPI rank's image


def build(args: argparse.Namespace) -> int:
    planned = plan_build(job_options(args))
    art = compile_build(planned, quiet=False, jobs=args.jobs, cache_dir=args.cache_dir)
    board, plan = planned.board, planned.plan
    idf = board.idf
    built = BuildSummary(
        board.name,
        art.program,
        art.weights,
        art.plan_json,
        art.generated,
        art.model_hash(),
        plan.quant,
        plan.n_ctx,
        idf_project=art.out_dir / idf.project_dir if idf is not None else None,
        idf_built=art.program.exists() if idf is not None else None,
        rank_weights=list(art.rank_weights()) or None,
    )
    if args.json:
        print_json(built.to_json())
    elif idf is not None and not art.program.exists():
        print(
            f"generated the ESP-IDF project {built.idf_project} for {board.name} ({plan.spec.architecture}, "
            f"{plan.quant}, context {plan.n_ctx}); ESP-IDF is not installed here, so build it with "
            f"`idf.py build` in that directory (ESP-IDF >= {idf.min_version}), then `./colibri flash`"
        )
    else:
        print(f"built {art.program} for {board.name} ({plan.spec.architecture}, {plan.quant}, context {plan.n_ctx})")
        print(f"weight image {art.weights} ({art.weights.stat().st_size:,} bytes, model hash {built.model_hash[:16]})")
        for rank, image in enumerate(art.rank_weights()):
            print(f"rank {rank}'s weight image {image} ({image.stat().st_size:,} bytes)")
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    add_ranks_arg(p)
    add_budget_arg(p)


def report(args: argparse.Namespace) -> int:
    rep = job.report(job_options(args))
    if args.json:
        print_json(rep.to_json())
    else:
        print(format_report(rep))
    if not rep.fits:
        raise ColibriError(report_problem(rep))
    return 0


def add_clean_arguments(p: argparse.ArgumentParser) -> None:
    # Own dests: a colibri.toml's board and model are defaults for building, not what to delete.
    p.add_argument("--board", dest="only_board", metavar="BOARD", help="only this board's builds")
    p.add_argument("--model", dest="only_model", type=Path, metavar="DIR", help="only this model's builds")
    p.add_argument("--cache", action="store_true", help="empty the build cache too (see --cache-dir)")
    add_cache_arg(p)
    add_json_arg(p)


@dataclass(frozen=True)
class Cleaned(JsonDocument):
    """clean --json's document: the build directories removed (under build/) and the bytes freed."""

    removed: list[str]
    bytes: int
    cache: str | None = json_field(default=None, omit_none=True)  # with --cache: the cache emptied
    cache_bytes: int | None = json_field(default=None, omit_none=True)


def clean(args: argparse.Namespace) -> int:
    from ..compile import build

    root = build.BUILD_ROOT
    dirs = build_dirs(args.only_board, args.only_model)
    what = " and ".join(
        part
        for part in (
            f"board {args.only_board}" if args.only_board else "",
            f"model {Path(args.only_model).name}" if args.only_model else "",
        )
        if part
    )
    cache: Path | None = None
    cache_freed = 0
    if args.cache:
        cache = resolve_cache_dir(args.cache_dir)
        cache_freed = empty_cache(cache)
    cache_text = f"emptied the build cache {cache} ({cache_freed / 1e6:.1f} MB)" if cache is not None else None
    cache_name = str(cache) if cache is not None else None
    cache_bytes = cache_freed if cache is not None else None
    if not dirs:
        message = f"nothing to clean under {root}" + (f" for {what}" if what else "")
        if args.json:
            print_json(Cleaned([], 0, cache_name, cache_bytes).to_json(), indent=None)
        else:
            print(message)
            if cache_text:
                print(cache_text)
        return 0
    freed = remove_builds(dirs)
    shown = [f"{root.name}/{d.relative_to(root)}" for d in dirs]
    if args.json:
        print_json(Cleaned(shown, freed, cache_name, cache_bytes).to_json())
    else:
        print(f"removed {', '.join(shown)} ({freed / 1e6:.1f} MB)")
        if cache_text:
            print(cache_text)
    return 0


@dataclass(frozen=True)
class RegionSummary(JsonDocument):
    name: str
    kind: str
    bytes: int | None  # None: no fixed size
    holds: list[str]


@dataclass(frozen=True)
class BoardSummary(JsonDocument):
    """boards --json's entry for one board: what it is, how it runs here, its memory."""

    name: str
    description: str
    isa: str
    runs_here: str
    emulated_by: str | None
    memory: list[RegionSummary]
    default_ctx: int
    flashed: bool

    @classmethod
    def of(cls, board: Board) -> BoardSummary:
        regions = [RegionSummary(r.name, r.kind, r.size or None, list(r.holds)) for r in board.memory]
        runner = board.runner
        return cls(
            board.name,
            board.description,
            board.isa,
            runner.how_it_runs(),
            runner.emulated_by(),
            regions,
            board.default_ctx,
            board.is_flashed,
        )


def _size(n: int | None) -> str:
    if not n:
        return "no fixed budget"
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def boards(args: argparse.Namespace) -> int:
    summaries = [BoardSummary.of(load_board(name)) for name in available_boards()]
    if args.json:
        print_json([b.to_json() for b in summaries])
        return 0
    width = max(len(b.name) for b in summaries)
    for b in summaries:
        memory = ", ".join(f"{r.name} {_size(r.bytes)}" for r in b.memory)
        print(
            f"{b.name:<{width}}  {b.description}; runs {b.runs_here}; memory: {memory}; default context {b.default_ctx}"
        )
    return 0


COMMANDS = [
    Command("build", "generate the sources and build the firmware for a board", add_build_arguments, build),
    Command(
        "report", "where every byte goes, per memory region, checked against the ELF", add_report_arguments, report
    ),
    Command(
        "clean", "remove builds under build/: all of them, or one board's or one model's", add_clean_arguments, clean
    ),
    Command("boards", "list the boards: what each is, how it runs here, its memory", add_json_arg, boards),
]
