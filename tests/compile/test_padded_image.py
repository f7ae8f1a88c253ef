"""The firmware refuses an image file it should not read before reading it: a valid image padded to
3 GiB (a sparse file: nothing of it is written to disk) ends in error 6 at once, with the firmware's
memory never holding the padding (mapped and --copy-weights alike); a FIFO is refused, not waited on."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from generator.device.protocol import parse_frame
from generator.device.session import RunRequest, request_frame
from generator.files import DEFAULT_MODEL
from generator.numerics.sampling import SamplingParams

PADDED_BYTES = 3 << 30

# The firmware started by a small fresh process, which says the firmware's own peak memory last on
# stderr: Linux carries a process's peak over fork and exec, so the firmware started straight from
# this test's worker (itself grown past a GB by earlier tests) would report the worker's peak.
FRESH_PEAK = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, _, usage = os.wait4(pid, 0)
print(f"peak_kib={usage.ru_maxrss}", file=sys.stderr)
"""


def run_firmware(program, weights, how: list[str]) -> tuple[list, int, float]:
    """The firmware given one request: its error frames' codes, its peak memory (bytes, its own
    rusage), and the seconds it took."""
    frame = request_frame(RunRequest([1, 2], 2, SamplingParams(), False))
    started = time.monotonic()
    fw = subprocess.Popen(
        [sys.executable, "-c", FRESH_PEAK, str(program), "--weights", str(weights), *how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    # A firmware blocked on its image file ends here, with its launcher.
    watchdog = threading.Timer(30, lambda: os.killpg(fw.pid, signal.SIGKILL))
    watchdog.start()
    try:
        fw.stdin.write(frame)
        fw.stdin.close()
        out = fw.stdout.read()
    finally:
        watchdog.cancel()
    fw.wait()
    said = fw.stderr.read().decode()
    peak_kib = int(said.rsplit("peak_kib=", 1)[1]) if "peak_kib=" in said else -1  # -1: killed
    errors = [f.fields["code"] for f in map(parse_frame, out.splitlines()) if f is not None and f.kind == "error"]
    return errors, peak_kib * 1024, time.monotonic() - started


@pytest.mark.parametrize("how", [[], ["--copy-weights"]], ids=["mapped", "copied"])
def test_a_padded_image_is_refused_before_it_is_read(builder, tmp_path, how):
    _, art, _ = builder.build(DEFAULT_MODEL, "q8_0", 128, "host")
    padded = tmp_path / "weights.img"
    shutil.copyfile(art.weights, padded)
    os.truncate(padded, PADDED_BYTES)
    errors, peak, seconds = run_firmware(art.program, padded, how)
    assert errors == ["6"], errors
    assert peak < 256 << 20, f"the firmware held {peak} B: it read the padding"
    assert seconds < 5, seconds


@pytest.mark.parametrize("how", [[], ["--copy-weights"]], ids=["mapped", "copied"])
def test_a_fifo_as_the_image_is_refused_not_waited_on(builder, tmp_path, how):
    _, art, _ = builder.build(DEFAULT_MODEL, "q8_0", 128, "host")
    fifo = tmp_path / "weights.img"
    os.mkfifo(fifo)
    errors, _, seconds = run_firmware(art.program, fifo, how)
    assert errors == ["1"], errors
    assert seconds < 5, seconds
