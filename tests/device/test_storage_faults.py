"""Storage that fails under a running Linux firmware (issue 29 item 3), with real mechanisms: a FUSE
file system (tests/faulty_fs.c) whose reads of chosen bytes fail with EIO or come up short, and the
image file truncated, rewritten or replaced while the firmware has it mapped and reads experts from
it. Each fault ends the request with one error frame naming the expert (layer, expert id) and the
cause, the tokens before it are the clean run's, none after it; the process exits 1, never by
SIGBUS or SIGSEGV. A rename over the file changes nothing: the firmware decodes on from the file it
opened. Unlimited runs keep the mapping here (--map-weights): by default an unlimited model that
fits in memory is read into it at start, and then nothing done to the file reaches the decode."""

import os
import select
import shutil
import subprocess
import time

import pytest
from conftest import TESTS
from damaged_images import entry

from generator.compile.cache_plan import cache_plan
from generator.compile.image import read_header
from generator.device.protocol import FrameReader
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, request_frame
from generator.errors import ColibriError

pytestmark = pytest.mark.slow  # a MoE build, and firmware runs through FUSE

PROMPT = [1, 5, 9, 33, 7, 12]
MORE = [4, 8]
STEPS = 8


@pytest.fixture(scope="module")
def faulty_fs(tmp_path_factory):
    """(backing dir, mount point, control file) of a mounted tests/faulty_fs.c."""
    if shutil.which("pkg-config") is None or subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        pytest.skip("libfuse3-dev is not installed (tests/apt-packages.txt: ./colibri test installs it)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse in this container: FUSE cannot mount")
    root = tmp_path_factory.mktemp("faulty_fs")
    program = root / "faulty_fs"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True).stdout.split()
    subprocess.run(
        ["gcc", "-std=c11", "-O2", "-Wall", "-Werror", "-o", str(program), str(TESTS / "faulty_fs.c"), *flags],
        check=True,
    )
    backing, mount, control = root / "backing", root / "mount", root / "control"
    backing.mkdir()
    mount.mkdir()
    control.write_text("")
    fs = subprocess.Popen([str(program), str(backing), str(mount), str(control)], stderr=subprocess.PIPE)
    for _ in range(100):
        if os.path.ismount(mount) or fs.poll() is not None:
            break
        time.sleep(0.05)
    if not os.path.ismount(mount):
        fs.kill()
        pytest.skip(f"FUSE cannot mount in this container: {fs.stderr.read().decode(errors='replace').strip()}")
    yield backing, mount, control
    control.write_text("")
    subprocess.run(["umount", str(mount)], check=False)
    fs.wait(timeout=10)


@pytest.fixture(scope="module")
def moe(builder, checkpoints):
    """qwen3_moe (2 MoE layers, 8 experts, top-3) and its smallest budget: 3 slots, every use a miss,
    so every token reads its experts from the file."""
    board, art, plan = builder.build(checkpoints("qwen3_moe"), "q8_0", 64)
    return board, art, plan, cache_plan(plan, board.budget_reserve, 0).constants.min_budget


class Firmware:
    """The firmware as a process serving requests one at a time on its stdin."""

    def __init__(self, program, weights, budget, pipe_bytes=0, mapped=True):
        argv = [str(program), "--weights", str(weights)]
        if budget:
            argv += ["--memory-budget", str(budget)]
        elif mapped:
            argv += ["--map-weights"]
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if pipe_bytes:
            import fcntl

            fcntl.fcntl(self.p.stdout.fileno(), 1031, pipe_bytes)  # F_SETPIPE_SZ: the firmware blocks sooner
        self.reader = FrameReader()
        self.held = 0

    def wait_blocked(self, timeout=60):
        """Until the firmware has filled its (shrunk) stdout pipe: it is blocked mid-request."""
        import fcntl
        import struct
        import termios

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            waiting = struct.unpack("i", fcntl.ioctl(self.p.stdout.fileno(), termios.FIONREAD, b"\0" * 4))[0]
            if waiting >= 3500:  # a 4096-byte pipe with no room for another ~100-byte token frame
                return
            time.sleep(0.02)
        raise AssertionError("the firmware never filled its stdout pipe")

    def send(self, prompt, steps):
        request = RunRequest(prompt, steps, start=self.held, stop_at_eos=False)
        self.p.stdin.write(request_frame(request))
        self.p.stdin.flush()

    def answer(self, timeout=60):
        """The frames up to the request's done or error frame."""
        frames, end = [], time.monotonic() + timeout
        while not frames or frames[-1].kind not in ("done", "error"):
            ready, _, _ = select.select([self.p.stdout], [], [], max(0.0, end - time.monotonic()))
            assert ready, f"no answer within {timeout} s: {frames}"
            data = os.read(self.p.stdout.fileno(), 65536)
            assert data, f"the firmware ended without an answer (exit {self.p.wait()}): {frames}"
            frames += [f for f in self.reader.feed(data) if f.kind != "hello"]
        if frames[-1].kind == "done":
            self.held = int(frames[-1].fields["held"])
        return frames

    def ask(self, prompt, steps):
        self.send(prompt, steps)
        return self.answer()

    def close(self):
        self.p.stdin.close()
        rest = self.reader.feed(self.p.stdout.read())
        status = self.p.wait(timeout=60)
        return status, rest


def tokens(frames):
    return [(f.fields["step"], f.fields["id"]) for f in frames if f.kind == "token"]


def experts_used(frames):
    """(layer, expert) of every routed expert the request used."""
    used = []
    for f in frames:
        if f.kind == "experts":
            first = int(f.fields["first"])
            for i, n in enumerate(f.fields["counts"].split(",")):
                if int(n):
                    used.append((int(f.fields["layer"]), first + i))
    return used


def expert_middle(blob, plan, layer, expert):
    """A file offset in the middle of the expert's bytes (its up matrix): no aligned read of another
    expert reaches it."""
    index = [t.name for t in plan.tensors].index(f"layers.{layer}.experts.{expert}.w_up")
    _, _, _, offset, size, _ = entry(blob, index)
    return read_header(blob).data_offset + offset + size // 2


def clean_second_request(art, budget):
    fw = Firmware(art.program, art.weights, budget)
    fw.ask(PROMPT, STEPS)
    second = fw.ask(MORE, STEPS)
    assert fw.close()[0] == 0
    return second


def assert_one_error(frames, clean, *patterns):
    """The request ended in one error frame (code 18) matching every pattern, after a prefix of the
    clean run's tokens and no other token."""
    import re

    assert [f.kind for f in frames].count("error") == 1 and frames[-1].kind == "error", frames
    assert frames[-1].fields["code"] == "18", frames[-1]
    for pattern in patterns:
        assert re.search(pattern, frames[-1].fields["msg"]), frames[-1].fields["msg"]
    got = tokens(frames)
    assert got == tokens(clean)[: len(got)] and len(got) < len(tokens(clean)), (got, tokens(clean))


@pytest.mark.parametrize("fault", ["eio", "short"])
def test_an_expert_read_that_fails_mid_decode_ends_in_one_error_naming_it(moe, faulty_fs, fault):
    # The firmware's stdout pipe is made small and left unread, so that it blocks writing a token
    # frame in the middle of a request; the disk starts failing then, on the middle of each expert
    # of one MoE layer; the next token's first read in that layer fails.
    board, art, plan, budget = moe
    backing, mount, control = faulty_fs
    shutil.copyfile(art.weights, backing / "image.bin")
    blob = art.weights.read_bytes()
    layer = max(layer for layer, _ in experts_used(clean_second_request(art, budget)))
    middles = [expert_middle(blob, plan, layer, e) for e in range(plan.spec.n_experts)]
    fw = Firmware(art.program, mount / "image.bin", budget, pipe_bytes=4096)
    expected = Firmware(art.program, art.weights, budget)
    try:
        for f in (fw, expected):
            assert f.ask(PROMPT, 2)[-1].kind == "done"  # the same file, read through FUSE, before the fault
        steps = 64 - fw.held - len(MORE)  # ~50 token frames of ~100 bytes: more than the pipe holds
        clean = expected.ask(MORE, steps)
        fw.send(MORE, steps)
        fw.wait_blocked()
        rules = (f"eio image.bin {m} {m + 1}" if fault == "eio" else f"short image.bin {m}" for m in middles)
        control.write_text("".join(rule + "\n" for rule in rules))
        second = fw.answer()
        cause = "the read failed: Input/output error" if fault == "eio" else "a short read: the file gave"
        assert_one_error(second, clean, rf"layer {layer} expert \d+ \(file bytes \d+\.\.\d+\): {cause}")
        assert len(tokens(second)) > 0  # mid-request, after some tokens
        # The expert named is one whose bytes hold a failing offset.
        start, end = (int(n) for n in second[-1].fields["msg"].split("file bytes ")[1].split(")")[0].split(".."))
        assert any(start <= m < end for m in middles)
    finally:
        control.write_text("")
        status, rest = fw.close()
        expected.close()
    assert status == 1, status  # an exit, never a signal
    assert all(f.kind != "token" for f in rest)


def test_the_host_says_a_failing_expert_read_in_one_line(moe, faulty_fs):
    board, art, plan, budget = moe
    backing, mount, control = faulty_fs
    shutil.copyfile(art.weights, backing / "image.bin")
    clean = clean_second_request(art, budget)
    layer, expert = experts_used(clean)[0]
    middle = expert_middle(art.weights.read_bytes(), plan, layer, expert)
    control.write_text(f"eio image.bin {middle} {middle + 1}\n")
    try:
        with pytest.raises(ColibriError) as failed:
            run_on_board(
                board,
                art.program,
                mount / "image.bin",
                RunRequest(PROMPT + MORE, STEPS, memory_budget=budget, stop_at_eos=False),
                art.model_hash(),
            )
    finally:
        control.write_text("")
    message = str(failed.value)
    assert (
        "\n" not in message
        and f"error 18: reading an expert from the weight image file failed: layer {layer} expert {expert}" in message
        and "Input/output error" in message
    ), message


def image_copy(moe, tmp_path, budgeted: bool):
    """The build, its budget (0 when not budgeted: the image read through the mapping) and a copy of
    its weight image for the test to damage."""
    board, art, plan, budget = moe
    image = tmp_path / "image.bin"
    shutil.copyfile(art.weights, image)
    return art, budget if budgeted else 0, image


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "mapped"])
def test_the_file_truncated_mid_request_ends_in_one_error_never_sigbus(moe, tmp_path, budgeted):
    # The firmware's stdout pipe is made small and left unread, so the firmware blocks writing a
    # token frame in the middle of a request; the file is cut there; then the rest is read.
    art, budget, image = image_copy(moe, tmp_path, budgeted)
    data_offset = read_header(art.weights.read_bytes()).data_offset
    fw = Firmware(art.program, image, budget, pipe_bytes=4096)
    fw.ask(PROMPT, 2)
    steps = 64 - fw.held - len(MORE)  # ~50 token frames of ~100 bytes: more than the pipe holds
    long_clean = Firmware(art.program, art.weights, budget)
    long_clean.ask(PROMPT, 2)
    expected = long_clean.ask(MORE, steps)
    assert long_clean.close()[0] == 0
    fw.send(MORE, steps)
    fw.wait_blocked()  # the firmware fills the pipe and blocks mid-request
    os.truncate(image, data_offset + 64)
    frames = fw.answer()
    status, _ = fw.close()
    assert status == 1, status  # not -7 (SIGBUS) nor -11
    if budgeted:
        # The resident part is the firmware's own copy: the next expert read sees the cut file.
        assert_one_error(
            frames,
            expected,
            r"layer \d+ expert \d+ \(file bytes \d+\.\.\d+\): the weight image file "
            r"changed \(truncated or rewritten\)",
        )
    else:
        # Everything is read through the mapping: the fault on a cut page becomes the error frame.
        assert_one_error(
            frames,
            expected,
            r"reading the mapped weight image file failed at byte \d+ "
            r"\((the resident weights|layer \d+ expert \d+)\): the file was truncated",
        )
        at = int(frames[-1].fields["msg"].split("at byte ")[1].split()[0])
        assert at >= data_offset + 64
    assert len(tokens(frames)) > 0  # it was cut mid-request, after some tokens


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "mapped"])
def test_the_file_rewritten_in_place_is_refused_at_the_next_request(moe, tmp_path, budgeted):
    art, budget, image = image_copy(moe, tmp_path, budgeted)
    fw = Firmware(art.program, image, budget)
    fw.ask(PROMPT, STEPS)
    blob = art.weights.read_bytes()
    with open(image, "r+b") as f:  # the same file (inode) written into: a resident byte and an expert's
        f.seek(read_header(blob).data_offset + 100)
        f.write(b"\x55")
    second = fw.ask(MORE, STEPS)
    assert [f.kind for f in second] == ["error"] and second[0].fields["code"] == "18"
    assert (
        "the weight image file changed (truncated or rewritten) since the firmware opened it" in second[0].fields["msg"]
    )
    assert fw.close()[0] == 1


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "mapped"])
def test_a_file_renamed_over_the_image_changes_nothing_until_restart(moe, tmp_path, budgeted):
    board, art, plan, budget = moe
    budget = budget if budgeted else 0
    clean = clean_second_request(art, budget)
    image = tmp_path / "image.bin"
    shutil.copyfile(art.weights, image)
    fw = Firmware(art.program, image, budget)
    fw.ask(PROMPT, STEPS)
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(len(art.weights.read_bytes()) // 2))  # not even an image
    os.replace(other, image)
    second = fw.ask(MORE, STEPS)
    assert tokens(second) == tokens(clean) and second[-1].kind == "done"
    assert fw.close()[0] == 0
    # A restart opens the new file, and refuses it.
    again = Firmware(art.program, image, budget)
    again.send(PROMPT, STEPS)
    status, frames = again.close()
    assert status == 1 and [f.kind for f in again.reader.frames][-1] == "error"


def test_an_unlimited_model_read_into_memory_decodes_on_whatever_happens_to_the_file(moe, tmp_path):
    # No budget and no --map-weights: the image fits in memory, so it is read in at start (2 MiB
    # pages) and the file is never read again: cut and rewritten, the decode goes on unchanged.
    board, art, plan, budget = moe
    clean = clean_second_request(art, 0)
    image = tmp_path / "image.bin"
    shutil.copyfile(art.weights, image)
    fw = Firmware(art.program, image, 0, mapped=False)
    first = fw.ask(PROMPT, STEPS)
    stats = next(f for f in first if f.kind == "stats").fields
    assert int(stats["resident"]) == image.stat().st_size
    with open(image, "r+b") as f:
        f.seek(read_header(art.weights.read_bytes()).data_offset + 100)
        f.write(b"\x55")
    os.truncate(image, 64)
    second = fw.ask(MORE, STEPS)
    assert tokens(second) == tokens(clean) and second[-1].kind == "done"
    assert fw.close()[0] == 0
