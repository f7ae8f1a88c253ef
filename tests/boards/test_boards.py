"""Cross targets: the same logits on every board, ESP32-P4 images esptool accepts, budgets."""

import json

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator.boards import available_boards, load_board, read_board_file
from generator.compile.esp32.flash_image import check_app_image, load_segments
from generator.errors import ColibriError
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

pytestmark = pytest.mark.slow  # builds for every board

PROMPT = [1, 21, 51, 68, 104, 44, 74, 51, 100]  # "In the beginning"
SAMPLED = SamplingParams(0.8, top_k=40, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def host_run(builder):
    return builder.run(DEFAULT_MODEL, PROMPT, 40, ctx=128, sampling=SAMPLED)


@pytest.mark.parametrize("board", ["linux-aarch64", "qemu-rv32"])
def test_every_board_decodes_the_same_bits_as_host_and_the_reference(board, builder, host_run):
    art, plan, request, result = builder.run(DEFAULT_MODEL, PROMPT, 40, ctx=128, sampling=SAMPLED, board=board)
    host = host_run[3]
    assert result.tokens == host.tokens
    assert result.digests == host.digests
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, 40, SAMPLED, stop_at_eos=False)
    assert result.digests == ref.digests
    assert result.hello["board"] == board


def test_qemu_rv32_reports_exact_instruction_counts(builder):
    runs = [builder.run(DEFAULT_MODEL, PROMPT, 8, ctx=128, board="qemu-rv32")[3] for _ in range(2)]
    first, second = (r.stats for r in runs)
    assert int(first["decode_instret"]) > 0 and int(first["prefill_instret"]) > 0
    # -icount shift=0: the count is exact, so two runs agree to the instruction.
    assert first["decode_instret"] == second["decode_instret"]
    assert first["prefill_instret"] == second["prefill_instret"]


def test_qemu_rv32_reads_the_weights_in_place_and_refuses_a_damaged_image(builder, tmp_path):
    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest

    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 128, "qemu-rv32")
    blob = bytearray(art.weights.read_bytes())
    blob[5000] ^= 0x40
    damaged = tmp_path / "damaged.img"
    damaged.write_bytes(bytes(blob))
    with pytest.raises(ColibriError, match="error 17: weight image tensor data is corrupted"):
        run_on_board(board, art.program, art.weights, RunRequest(PROMPT, 4), art.model_hash(), flash_image=damaged)


def test_esp32p4_build_gives_an_image_esptool_accepts_inside_the_safe_window(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 128, "esp32p4")
    app = art.out_dir / "firmware.bin"
    info = check_app_image(board, app)
    assert "ESP32-P4" in info and "v1.0" in info and "v3.99" in info
    lo, hi = board.flash.load_window
    assert (lo, hi) == (0x4FF40000, 0x4FFA0000)
    segments = load_segments(art.program)
    assert segments and all(lo <= a and a + n <= hi for a, n in segments)
    merged = (art.out_dir / "flash.bin").read_bytes()
    assert merged[0x2000 : 0x2000 + app.stat().st_size] == app.read_bytes()
    assert merged[0x2000] == 0xE9  # ESP image magic at the ROM loader's offset


def test_a_model_too_big_for_esp32p4_fails_before_compiling_with_the_numbers(checkpoints, tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        "build", "--board", "esp32p4", "--model", checkpoints("llama3_rope_bias"), "--ctx", "256", "--out", out
    )
    assert done.returncode == 2
    assert "does not fit board esp32p4: region l2mem needs" in done.stderr and "but has 393,216 B" in done.stderr
    assert not out.exists()
    done = run_cli("build", "--board", "esp32p4", "--model", DEFAULT_MODEL, "--ctx", "300", "--out", out)
    assert done.returncode == 2 and "max_position_embeddings" in done.stderr


@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32", "esp32p4"])
def test_report_json_exists_for_every_board_and_accounts_for_each_region(board, builder):
    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 128, board)
    done = run_cli("report", "--board", board, "--model", DEFAULT_MODEL, "--ctx", "128", "--out", art.out_dir, "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert [r["name"] for r in rep["regions"]] == [m.name for m in b.memory]
    placed = {k for r in rep["regions"] for k in r["items"]}
    assert {"code", "weights", "kv_cache", "scratch", "rope_tables"} <= placed
    assert rep["fits"]
    if board == "esp32p4":
        (l2mem,) = rep["regions"]
        assert l2mem["used"] <= 0.9 * l2mem["budget"]  # the default model fits with room to spare (~45 KB)
        assert l2mem["items"]["stack"] > 0 and rep["largest_ctx_that_fits"] >= 128


def test_every_board_file_loads():
    assert {"host", "linux-aarch64", "qemu-rv32", "esp32p4"} <= set(available_boards())
    for name in available_boards():
        board = load_board(name)
        assert board.memory and board.cc


@pytest.mark.parametrize("board,threads", [("host", 2), ("host", 3), ("linux-aarch64", 2)])
def test_threads_give_the_same_bits(board, threads, builder, host_run):
    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest

    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 128, board)
    request = RunRequest(PROMPT, 40, SAMPLED, stop_at_eos=False, threads=threads)
    result = run_on_board(b, art.program, art.weights, request, art.model_hash())
    assert result.stats["threads"] == str(threads)
    assert result.tokens == host_run[3].tokens and result.digests == host_run[3].digests


def test_mcu_boards_refuse_threads(builder):
    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest

    b, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 128, "qemu-rv32")
    with pytest.raises(ColibriError, match="runs single-threaded"):
        run_on_board(
            b, art.program, art.weights, RunRequest(PROMPT, 4, threads=2), art.model_hash(), flash_image=art.flash_image
        )


def _board_data(name: str) -> dict:
    return read_board_file(load_board(name).path)


def test_each_way_a_board_runs_says_what_it_can_do():
    host, rv32, p4 = load_board("host"), load_board("qemu-rv32"), load_board("esp32p4")
    assert host.runner.takes_remote and host.runner.takes_memory_budget and host.runner.probes_bandwidth
    assert host.runner.runs_here and not host.runner.needs_port and not host.runner.counts_instructions_exactly()
    assert rv32.runner.runs_here and rv32.runner.counts_instructions_exactly()
    assert rv32.runner.emulated_by() == "qemu-system-riscv32" and "qemu-system-riscv32" in rv32.tools()
    assert not rv32.runner.takes_remote and not rv32.runner.takes_memory_budget
    assert p4.runner.needs_port and not p4.runner.runs_here and p4.runner.emulated_by() is None
    assert p4.is_flashed and not p4.is_esp_idf and load_board("esp32p4-idf").is_esp_idf


def test_a_malformed_runner_or_predict_section_is_refused_when_the_board_loads():
    from pathlib import Path

    from generator.boards import board_from_data

    data = _board_data("host")
    with pytest.raises(ColibriError, match=r"x.toml: malformed board file \(runner kind 'ssh' is not one of"):
        board_from_data({**data, "runner": {**data["runner"], "kind": "ssh"}}, Path("x.toml"))
    with pytest.raises(ColibriError, match=r"\[predict\] clock_hz must be a positive number"):
        board_from_data(
            {**data, "predict": {"clock_hz": 0, "cycles_per_instruction": 1.0, "weight_bytes_per_s": 1e6}},
            Path("x.toml"),
        )


def test_a_speculating_board_gives_a_pass_cost_per_token_count_starting_at_one_and_never_falling():
    from pathlib import Path

    from generator.boards import board_from_data

    assert load_board("host").speculate_pass_cost[0] == 1.0 and len(load_board("host").speculate_pass_cost) == 8
    assert load_board("qemu-rv32").speculate_pass_cost == ()
    data = _board_data("host")
    bad = {
        "missing": (None, r"must list 8 costs"),
        "short": ([1.0, 1.5], r"must list 8 costs"),
        "not 1 first": ([1.5, 2, 3, 4, 5, 6, 7, 8], r"must start at 1.0 .* and never fall"),
        "falling": ([1.0, 2, 1.5, 4, 5, 6, 7, 8], r"must start at 1.0 .* and never fall"),
        "not a number": ([1.0, "2", 3, 4, 5, 6, 7, 8], r"must hold finite numbers"),
        "infinite": ([1.0, 2, 3, 4, 5, 6, 7, float("inf")], r"must hold finite numbers"),
    }
    for name, (costs, message) in bad.items():
        board = {k: v for k, v in data.items() if k != "speculate_pass_cost"}
        if costs is not None:
            board["speculate_pass_cost"] = costs
        with pytest.raises(ColibriError, match=r"x.toml: malformed board file \(speculate_pass_cost " + message):
            board_from_data(board, Path("x.toml"))
    no_speculation = {**_board_data("qemu-rv32"), "speculate_pass_cost": [1.0]}
    with pytest.raises(ColibriError, match=r"speculate_pass_cost is for boards with speculate_tokens of 2 or more"):
        board_from_data(no_speculation, Path("x.toml"))


def test_qemu_rv32_predicts_with_the_esp32p4_idf_timing_model():
    from generator.bench import predict_speed, predicted_timing

    timing = predicted_timing(load_board("qemu-rv32"))
    assert timing == load_board("esp32p4-idf").predict
    assert timing.describe() == "400 MHz, 1.0 cycles/instruction, weights at 84 MB/s, the slower of the two"
    assert predict_speed(timing, 4e6, 10**6).tok_s == 1.0 / max(4e6 / 400e6, 10**6 / 84e6)


def test_a_build_only_board_has_no_link(tmp_path):
    from generator.boards import board_from_data
    from generator.device.links import open_link

    data = _board_data("esp32p4")
    board = board_from_data({**data, "runner": {**data["runner"], "kind": "none"}}, tmp_path / "b.toml")
    assert board.runner.how_it_runs() == "not from here (build only)"
    with pytest.raises(ColibriError, match=r"board esp32p4 cannot be run from here \(runner 'none'\)"):
        open_link(board, tmp_path / "fw", tmp_path / "w.img", "0" * 64)


def test_a_board_file_kept_elsewhere_is_given_by_its_path(tmp_path):
    from generator.boards import board_reference

    text = load_board("host").path.read_text()
    assert 'name = "host"' in text and "default_ctx = 512" in text
    mine = tmp_path / "my-host.toml"
    mine.write_text(text.replace('name = "host"', 'name = "my-host"').replace("default_ctx = 512", "default_ctx = 96"))
    board = load_board(str(mine))
    assert (board.name, board.default_ctx, board.path) == ("my-host", 96, mine)
    assert board_reference(board) == str(mine) and board_reference(load_board("host")) == "host"

    # the build's SCons run takes the same file: the plan has its context
    r = run_cli("run", "--board", mine, "--prompt-ids", "1,21,51", "--steps", "4", "--json", "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "b" / "generated" / "plan.json").read_text())["n_ctx"] == 96
    assert json.loads(r.stdout)["board"] == "my-host"

    r = run_cli("run", "--board", tmp_path / "missing.toml", "--prompt-ids", "1", "--steps", "1")
    assert r.returncode != 0 and f"no board file {tmp_path / 'missing.toml'}" in r.stderr
    # a release is rebuilt from the repository's sources: its board must be one of targets/
    r = run_cli("release", "--board", mine, "--out", tmp_path / "rel")
    assert r.returncode != 0 and f"{mine} is not a board file of targets/" in r.stderr
    assert not (tmp_path / "rel").exists()
