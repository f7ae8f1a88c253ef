"""The firmware refuses an image file longer than its header says before reading it: a valid image
padded to 3 GiB (a sparse file: nothing of it is written to disk) ends in error 6 at once, with the
firmware's memory never holding the padding (mapped and --copy-weights alike)."""

import os
import shutil
import subprocess
import time

import pytest

from generator.device.protocol import parse_frame
from generator.device.session import RunRequest, request_frame
from generator.files import DEFAULT_MODEL
from generator.numerics.sampling import SamplingParams

PADDED_BYTES = 3 << 30


@pytest.mark.parametrize("how", [[], ["--copy-weights"]], ids=["mapped", "copied"])
def test_a_padded_image_is_refused_before_it_is_read(builder, tmp_path, how):
    _, art, _ = builder.build(DEFAULT_MODEL, "q8_0", 128, "host")
    padded = tmp_path / "weights.img"
    shutil.copyfile(art.weights, padded)
    os.truncate(padded, PADDED_BYTES)
    frame = request_frame(RunRequest([1, 2], 2, SamplingParams(), False))
    started = time.monotonic()
    fw = subprocess.Popen(
        [str(art.program), "--weights", str(padded), *how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    fw.stdin.write(frame)
    fw.stdin.close()
    out = fw.stdout.read()
    _, _, usage = os.wait4(fw.pid, 0)  # the firmware's own peak memory, not the test's
    seconds = time.monotonic() - started
    errors = [f for f in map(parse_frame, out.splitlines()) if f is not None and f.kind == "error"]
    assert [e.fields["code"] for e in errors] == ["6"], out
    assert usage.ru_maxrss * 1024 < 256 << 20, f"the firmware held {usage.ru_maxrss} KiB: it read the padding"
    assert seconds < 5, seconds
