"""--memory-budget auto: the memory the firmware may use where it runs (the smaller of its memory
cgroup's limit and MemAvailable) less a margin. One rule on both sides, checked against each other on
fake /proc and /sys trees (compile/cache_plan.py find_memory, bsp/linux/memory_limit.c); the budget
it gives; the firmware resolving it itself; the CLI refusing a malformed or too small one. The real
run in a memory cgroup is in test_memory_cgroup.py."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from c_builds import gcc
from cli_runs import main_json
from conftest import REPO

from generator.boards import board_from_data
from generator.compile.cache_plan import (
    AUTO_MARGIN_BYTES,
    AutoBudget,
    MemoryFound,
    auto_cache_plan,
    cache_plan,
    find_memory,
    parse_budget,
)
from generator.device.protocol import encode_frame, parse_frame
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, Session, cache_stats
from generator.errors import ColibriError
from generator.verify import budget_text, run_stats

pytestmark = pytest.mark.slow  # budgets decided inside built firmware

NO_LIMIT_V1 = "9223372036854771712"  # what v1 writes for no limit
GIB = 2**30


def tree(root: Path, cgroup: str, files: dict[str, str], available_kib: int | None = 20 * 2**20) -> Path:
    """A fake root: /proc/self/cgroup, /proc/meminfo (MemAvailable in KiB; None: no such line) and
    the files under /sys/fs/cgroup."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    meminfo = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\n"
    if available_kib is not None:
        meminfo += f"MemAvailable:   {available_kib} kB\n"
    (root / "proc/meminfo").write_text(meminfo + "Buffers:           12345 kB\n")
    for name, text in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V1_LINES = "9:name=systemd:/\n4:memory:/jobs/run7\n1:cpu:/\n0::/\n"
TREES = {
    # name: (cgroup file, files under sys/fs/cgroup, MemAvailable KiB, expected (source, bytes, where) or None)
    "v2 limit": (
        "0::/user.slice/fw.scope\n",
        {"user.slice/fw.scope/memory.max": "4831838208\n", "user.slice/memory.max": "max\n"},
        20 * 2**20,
        ("cgroup-v2", 4831838208, "/sys/fs/cgroup/user.slice/fw.scope/memory.max"),
    ),
    "v2 nested: the parent's smaller limit": (
        "0::/a/b/c\n",
        {"a/b/c/memory.max": "8589934592\n", "a/b/memory.max": "max\n", "a/memory.max": "2147483648\n"},
        20 * 2**20,
        ("cgroup-v2", 2 * GIB, "/sys/fs/cgroup/a/memory.max"),
    ),
    "v2 max everywhere: MemAvailable": (
        "0::/a\n",
        {"a/memory.max": "max\n"},
        3 * 2**20,
        ("meminfo", 3 * GIB, "/proc/meminfo"),
    ),
    "v1 limit": (
        V1_LINES,
        {
            "memory/jobs/run7/memory.limit_in_bytes": "1073741824\n",
            "memory/jobs/memory.limit_in_bytes": NO_LIMIT_V1 + "\n",
            "memory/memory.limit_in_bytes": NO_LIMIT_V1 + "\n",
        },
        20 * 2**20,
        ("cgroup-v1", GIB, "/sys/fs/cgroup/memory/jobs/run7/memory.limit_in_bytes"),
    ),
    "v1 nested: the parent's smaller limit": (
        V1_LINES,
        {"memory/jobs/run7/memory.limit_in_bytes": "4294967296\n", "memory/jobs/memory.limit_in_bytes": "3221225472\n"},
        20 * 2**20,
        ("cgroup-v1", 3 * GIB, "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes"),
    ),
    "v1 with the memory controller mounted with others": (
        "3:cpu,memory:/g\n",
        {"memory/g/memory.limit_in_bytes": "536870912\n"},
        20 * 2**20,
        ("cgroup-v1", 2**29, "/sys/fs/cgroup/memory/g/memory.limit_in_bytes"),
    ),
    "v1 no limit (2^63 - 4096): MemAvailable": (
        V1_LINES,
        {
            "memory/jobs/run7/memory.limit_in_bytes": NO_LIMIT_V1 + "\n",
            "memory/memory.limit_in_bytes": NO_LIMIT_V1 + "\n",
        },
        5 * 2**20,
        ("meminfo", 5 * GIB, "/proc/meminfo"),
    ),
    "hybrid: v1 memory and a v2 tree without it": (
        "0::/user.slice\n4:memory:/user.slice\n",
        {"unified/user.slice/cgroup.procs": "", "memory/user.slice/memory.limit_in_bytes": "6442450944\n"},
        20 * 2**20,
        ("cgroup-v1", 6 * GIB, "/sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes"),
    ),
    "a container: its own cgroup mounted as the root": (
        "4:memory:/docker/0123abcd\n",
        {"memory/memory.limit_in_bytes": "2147483648\n"},
        20 * 2**20,
        ("cgroup-v1", 2 * GIB, "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    ),
    "a limit above MemAvailable: MemAvailable": (
        "0::/big\n",
        {"big/memory.max": "34359738368\n"},
        6 * 2**20,
        ("meminfo", 6 * GIB, "/proc/meminfo"),
    ),
    "a tie: the cgroup's": (
        "0::/t\n",
        {"t/memory.max": str(6 * GIB) + "\n"},
        6 * 2**20,
        ("cgroup-v2", 6 * GIB, "/sys/fs/cgroup/t/memory.max"),
    ),
    "a malformed limit is no limit": (
        "0::/m\n",
        {"m/memory.max": "12 MB\n"},
        7 * 2**20,
        ("meminfo", 7 * GIB, "/proc/meminfo"),
    ),
    "no cgroup file": (None, {}, 9 * 2**20, ("meminfo", 9 * GIB, "/proc/meminfo")),
    "nothing at all": (None, {}, None, None),
}


@pytest.fixture(scope="module")
def c_rule(tmp_path_factory):
    """bsp/linux/memory_limit.c compiled alone with a harness that prints what it finds."""
    exe = gcc(
        tmp_path_factory.mktemp("memory_limit") / "memory_limit_harness",
        f"-I{REPO}/firmware_src/bsp/linux",
        REPO / "tests/c/memory_limit_harness.c",
        REPO / "firmware_src/bsp/linux/memory_limit.c",
    )

    def find(root: Path):
        out = subprocess.run([str(exe), str(root)], check=True, capture_output=True, text=True).stdout.split()
        return None if out == ["none"] else (out[0], int(out[1]), out[2])

    return find


@pytest.mark.parametrize("name", TREES)
def test_the_rule_on_fake_trees_is_the_same_in_python_and_in_the_firmware(tmp_path, c_rule, name):
    cgroup, files, available, expected = TREES[name]
    root = tree(tmp_path, cgroup or "", files, available)
    if cgroup is None:
        (root / "proc/self/cgroup").unlink()
    found = find_memory(root)
    assert (None if found is None else (found.source, found.nbytes, found.where)) == expected
    assert c_rule(root) == expected


def test_the_margin_is_one_number_on_both_sides():
    header = (REPO / "firmware_src/bsp/linux/memory_limit.h").read_text()
    m = re.search(r"#define COLIBRI_AUTO_MARGIN_BYTES \((\d+)ull << (\d+)\)", header)
    assert m and int(m.group(1)) << int(m.group(2)) == AUTO_MARGIN_BYTES == 128 * 2**20


def test_auto_parses_with_its_margin():
    assert parse_budget("auto") == AutoBudget() and str(AutoBudget()) == "auto"
    assert parse_budget("AUTO-512M") == AutoBudget(512 * 2**20) and str(parse_budget("auto-512M")) == "auto-512M"
    assert parse_budget("auto-0").margin == 0 and parse_budget("auto-0").firmware_option() == "auto-0"
    assert AutoBudget().firmware_option() == f"auto-{AUTO_MARGIN_BYTES}"
    assert parse_budget("6G") == 6 * GIB and parse_budget("0") == 0
    for bad in ("auto-", "auto-x", "auto-none", "auto512M", "autox", "auto--5M"):
        with pytest.raises(ValueError):
            parse_budget(bad)


def test_a_board_file_may_say_auto():
    data = {k: v for k, v in __import__("tomllib").loads((REPO / "targets/host.toml").read_text()).items()}
    assert board_from_data({**data, "memory_budget": "auto-64M"}, Path("x.toml")).memory_budget == AutoBudget(2**26)
    with pytest.raises(ColibriError, match="malformed board file .*auto"):
        board_from_data({**data, "memory_budget": "auto-lots"}, Path("x.toml"))


@pytest.fixture(scope="module")
def mixtral(builder, checkpoints):
    board, art, plan = builder.build(checkpoints("mixtral_moe"), "q8_0", 64)
    return board, art, plan, cache_plan(plan, board.budget_reserve, 0).constants


def found(nbytes: int) -> MemoryFound:
    return MemoryFound(nbytes, "cgroup-v1", "/sys/fs/cgroup/memory/fw/memory.limit_in_bytes")


def test_auto_gives_what_it_finds_less_the_margin_unlimited_when_the_whole_model_fits(mixtral):
    board, _, plan, c = mixtral
    k, margin = c.experts_per_token, AUTO_MARGIN_BYTES
    for usable, slots in (
        (c.min_budget, k),
        (c.budget_for(k + 3) + 100, k + 3),
        (c.budget_for(c.max_slots) - 1, c.max_slots - 1),
    ):
        cache = auto_cache_plan(plan, board.budget_reserve, AutoBudget(), found(usable + margin))
        assert (cache.budget, cache.slots) == (usable, slots)
        assert cache.firmware_budget == AutoBudget() and cache.to_dict()["auto"]["usable"] == usable
        assert "cgroup v1 limit" in cache.auto.describe(cache.unlimited)
        assert "whole model" not in cache.to_dict()["auto"]["why"]
    # Enough for every expert: the same as no budget at all, and it says so.
    whole = auto_cache_plan(plan, board.budget_reserve, AutoBudget(0), found(c.budget_for(c.max_slots)))
    assert whole.budget == 0 and whole.unlimited and whole.to_dict()["auto"]["whole_model"]
    assert "holds the whole model, so unlimited" in whole.to_dict()["auto"]["why"]


@pytest.mark.parametrize("nbytes", ["one short", "below the margin"])
def test_auto_too_small_is_one_line_with_the_numbers(mixtral, nbytes):
    board, _, plan, c = mixtral
    have = c.min_budget - 1 + AUTO_MARGIN_BYTES if nbytes == "one short" else AUTO_MARGIN_BYTES // 2
    with pytest.raises(ColibriError) as e:
        auto_cache_plan(plan, board.budget_reserve, AutoBudget(), found(have))
    text = str(e.value)
    assert "\n" not in text and text.startswith("--memory-budget auto (cgroup v1 limit ")
    assert f"({have:,} B, /sys/fs/cgroup/memory/fw/memory.limit_in_bytes) - margin 128.0 MiB" in text
    assert "is too small for mixtral_moe" in text and f"needs at least {c.min_budget:,} B" in text


def test_the_firmware_resolves_auto_itself_and_says_how(mixtral):
    board, art, plan, c = mixtral
    request = RunRequest([1, 5, 9, 33], 12, stop_at_eos=False)
    unlimited = run_on_board(board, art.program, art.weights, request, art.model_hash())
    # This machine's MemAvailable (no cgroup limit here) holds the tiny model many times: unlimited.
    auto = RunRequest(request.prompt, request.steps, stop_at_eos=False, memory_budget=AutoBudget())
    result = run_on_board(board, art.program, art.weights, auto, art.model_hash())
    stats = cache_stats(result)
    here = find_memory()
    assert stats.budget == 0 and stats.slots == 0 and stats.auto_margin == AUTO_MARGIN_BYTES
    assert (stats.auto_source, stats.auto_where) == (here.source, here.where)
    assert abs(stats.auto_found - here.nbytes) < here.nbytes / 4, "what the firmware found is what Python finds"
    assert result.digests == unlimited.digests and result.expert_counts == unlimited.expert_counts
    phrase = budget_text(run_stats(result, board, auto))
    assert phrase.startswith(" with --memory-budget auto on the board: ") and "holds the whole model" in phrase
    assert run_stats(result, board, auto).memory_budget == "auto"


def test_the_firmware_refuses_auto_that_cannot_hold_the_model_in_one_frame(mixtral):
    board, art, _, _ = mixtral
    request = RunRequest([1, 5], 2, memory_budget=AutoBudget(2**50))
    with pytest.raises(
        ColibriError,
        match=r"error 102: --memory-budget auto: meminfo \d+ B \(/proc/meminfo\) - margin "
        r"1125899906842624 B = 0 B cannot hold this model: it needs at least \d+ B",
    ):
        run_on_board(board, art.program, art.weights, request, art.model_hash())


def test_a_stats_frame_with_an_unknown_auto_source_is_refused():
    session = Session()
    session.handle(parse_frame(encode_frame(0, "hello", {"proto": 3}).rstrip(b"\n")))
    with pytest.raises(ColibriError, match="auto_source='swap' is none of cgroup-v2, cgroup-v1, meminfo"):
        session.handle(
            parse_frame(
                encode_frame(
                    1, "stats", {"mapped": 1, "budget": 5, "auto_found": 9, "auto_margin": 4, "auto_source": "swap"}
                ).rstrip(b"\n")
            )
        )


def test_cli_refuses_a_malformed_or_too_small_auto_before_building(checkpoints, tmp_path, capsys):
    from generator.cli import main

    model = checkpoints("mixtral_moe")
    out = tmp_path / "out"
    base = ["verify", "--model", str(model), "--ctx", "64", "--prompt-ids", "1,2", "--steps", "4", "--out", str(out)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*base, "--memory-budget", "auto-lots"])
    assert e.value.code == 2 and "auto-MARGIN takes a margin such as auto-256M" in capsys.readouterr().err
    # A margin larger than this machine's memory leaves nothing: refused here, before building.
    assert main([*base, "--memory-budget", "auto-1T"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "--memory-budget auto-1T (MemAvailable" in err[0] and "is too small for mixtral_moe" in err[0]
    )
    assert "- margin 1024.00 GiB = 0 B) is too small" in err[0] and "whole model" not in err[0]
    assert not out.exists(), "nothing built for a refused budget"


def test_report_shows_what_auto_chooses_here_and_why(checkpoints, tmp_path, capsys):
    from generator.cli import main

    model = tmp_path / "config-only"
    model.mkdir()
    (model / "config.json").write_bytes((checkpoints("mixtral_moe") / "config.json").read_bytes())
    assert main(["report", "--model", str(model), "--ctx", "64", "--memory-budget", "auto", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)["memory_budget"]
    here = find_memory()
    assert auto["auto"]["source"] == here.source and auto["auto"]["margin"] == AUTO_MARGIN_BYTES
    assert auto["unlimited"] and auto["auto"]["whole_model"], "a tiny model under this machine's memory: unlimited"
    assert main(["report", "--model", str(model), "--ctx", "64", "--memory-budget", "auto"]) == 0
    text = capsys.readouterr().out
    assert re.search(
        r"memory budget auto on this machine now: (MemAvailable|cgroup v[12] limit) [0-9.]+ GiB .* - "
        r"margin 128.0 MiB = .*: it holds the whole model, so unlimited",
        text,
    ), text


def test_bench_reports_the_budget_the_firmware_chose(checkpoints, tmp_path, capsys):
    model = checkpoints("mixtral_moe")
    summary = main_json(
        capsys, "bench", model=model, ctx=64, out=tmp_path / "out", repeat=1, steps=4, memory_budget="auto"
    )
    budget = summary["memory_budget"]
    assert budget["unlimited"] and budget["auto"]["whole_model"] and budget["auto"]["source"] == find_memory().source
    assert budget["auto"]["margin"] == AUTO_MARGIN_BYTES and budget["auto"]["found"] > AUTO_MARGIN_BYTES
