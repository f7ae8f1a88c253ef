"""build, report, clean and boards: a firmware for a board and a model, where its bytes go, the
build directories, the boards there are."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import job
from ..arguments import add_budget_arg, add_jobs_arg, add_target_args
from ..boards import Board, available_boards, load_board
from ..compile.build import build_dirs, remove_builds
from ..errors import ColibriError
from ..job import compile_build, plan_build
from ..report import format_report, report_problem
from .common import Command, add_json_arg, job_options, print_json


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    add_jobs_arg(p)


def build(args: argparse.Namespace) -> int:
    planned = plan_build(job_options(args))
    art = compile_build(planned, quiet=False, jobs=args.jobs)
    board, plan = planned.board, planned.plan
    info = {
        "board": board.name,
        "program": str(art.program),
        "weights": str(art.weights),
        "plan": str(art.plan_json),
        "generated": str(art.generated),
        "model_hash": art.model_hash(),
        "quant": plan.quant,
        "n_ctx": plan.n_ctx,
    }
    idf = board.idf
    if idf is not None:
        info["idf_project"] = str(art.out_dir / idf.project_dir)
        info["idf_built"] = art.program.exists()
    if args.json:
        print_json(info)
    elif idf is not None and not art.program.exists():
        print(
            f"generated the ESP-IDF project {info['idf_project']} for {board.name} ({plan.spec.architecture}, "
            f"{plan.quant}, context {plan.n_ctx}); ESP-IDF is not installed here, so build it with "
            f"`idf.py build` in that directory (ESP-IDF >= {idf.min_version}), then `./colibri flash`"
        )
    else:
        print(f"built {art.program} for {board.name} ({plan.spec.architecture}, {plan.quant}, context {plan.n_ctx})")
        print(
            f"weight image {art.weights} ({art.weights.stat().st_size:,} bytes, model hash {info['model_hash'][:16]})"
        )
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    add_jobs_arg(p)
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
    add_json_arg(p)


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
    if not dirs:
        message = f"nothing to clean under {root}" + (f" for {what}" if what else "")
        if args.json:
            print_json({"removed": [], "bytes": 0}, indent=None)
        else:
            print(message)
        return 0
    freed = remove_builds(dirs)
    shown = [f"{root.name}/{d.relative_to(root)}" for d in dirs]
    if args.json:
        print_json({"removed": shown, "bytes": freed})
    else:
        print(f"removed {', '.join(shown)} ({freed / 1e6:.1f} MB)")
    return 0


def board_summary(board: Board) -> dict[str, object]:
    regions = [{"name": r.name, "kind": r.kind, "bytes": r.size or None, "holds": list(r.holds)} for r in board.memory]
    return {
        "name": board.name,
        "description": board.description,
        "isa": board.isa,
        "runs_here": board.runner.how_it_runs(),
        "emulated_by": board.runner.emulated_by(),
        "memory": regions,
        "default_ctx": board.default_ctx,
        "flashed": board.is_flashed,
    }


def _size(n: int | None) -> str:
    if not n:
        return "no fixed budget"
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def boards(args: argparse.Namespace) -> int:
    summaries = [board_summary(load_board(name)) for name in available_boards()]
    if args.json:
        print_json(summaries)
        return 0
    width = max(len(b["name"]) for b in summaries)
    for b in summaries:
        memory = ", ".join(f"{r['name']} {_size(r['bytes'])}" for r in b["memory"])
        print(
            f"{b['name']:<{width}}  {b['description']}; runs {b['runs_here']}; memory: {memory}; "
            f"default context {b['default_ctx']}"
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
