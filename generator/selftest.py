"""The self-test's golden vectors: what the firmware must decode by itself, with no host beside it.

The build embeds a short greedy decode computed by the NumPy reference on this very weight image
(the prompt, every step's token and the SHA-256 of every step's logits) in a generated
`selftest_data.c`; the firmware's `app/selftest.c` decodes the same prompt on a selftest request
(every board) and at boot (MCU boards whose board file says `[selftest] boot = true`), checks every
kernel of its set against the scalar one on a fixed input, and answers with one selftest frame:
PASS, or FAIL with what differed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .boards import Board
from .compile.emit import c_comment, environment
from .compile.image import map_image
from .compile.pipeline import SELFTEST_CHECKS_FILE, SELFTEST_DATA_FILE
from .compile.plan import Plan
from .device.session import Selftest
from .documents import JsonDocument, json_field
from .files import write_atomic
from .numerics.sampling import SamplingParams
from .reference import Reference

GOLDEN_FILE = SELFTEST_DATA_FILE
GOLDEN_TEMPLATE = "selftest_data.c.j2"
CHECKS_FILE = SELFTEST_CHECKS_FILE
CHECKS_TEMPLATE = "selftest_checks.h.j2"
# The block types whose kernels the self-test can check (firmware_src/app/selftest.c); f32 and q8_0
# (the activations' type) are always checked.
CHECKABLE = ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "mxfp4")


def checked_types(plan: Plan) -> dict[str, int]:
    """Block type -> 1 if this model's matrices use it (its kernels are checked), else 0."""
    used = {t.dtype for t in plan.tensors}
    return {name: int(name in used) for name in CHECKABLE}


def kernel_checks(plan: Plan) -> list[str]:
    """The kernels app/selftest.c checks against the scalar ones for this model, in its order (one
    name per comparison it counts in kernels_checked: quantize_q8_0 compares quants and scales)."""
    used = checked_types(plan)
    names = ["matvec_f32", "matmul_f32", "matvec_q8_0", "matmul_q8_0"]
    # q4_0 and q4_1 are checked before the table of the other block types
    for dtype in ("q4_0", "q4_1", *(t for t in CHECKABLE if t not in ("q4_0", "q4_1"))):
        if used[dtype]:
            names += [f"matvec_{dtype}", f"matmul_{dtype}"]
    names += ["quantize_q8_0", "quantize_q8_0", "swiglu"]
    if plan.spec.activation == "gelu_tanh":
        names.append("gelu_tanh_mul")
    return names + ["attention_scores", "attention_mix", "attention_scores_f16", "attention_mix_f16"]


def golden_prompt(plan: Plan, n: int) -> list[int]:
    """The self-test's prompt of n tokens: the BOS token (1 without one), then ids spread over the
    vocabulary, so every run of it reads rows from all over the embedding table."""
    vocab = plan.spec.vocab_size
    start = plan.spec.bos_token_id if plan.spec.bos_token_id is not None else 1
    return [start % vocab] + [(7919 * (i + 1)) % vocab for i in range(n - 1)]


@dataclass(frozen=True)
class Golden:
    prompt: list[int]
    tokens: list[int]  # greedy, end-of-sequence ignored: always `steps` of them
    digests: list[str]  # SHA-256 of every step's logits, hex

    def c_digests(self) -> list[str]:
        return [", ".join(f"0x{digest[i : i + 2]}" for i in range(0, 64, 2)) for digest in self.digests]


def golden_run(plan: Plan, weights: Path, board: Board) -> Golden:
    """The reference's greedy decode of the golden prompt on the image at `weights`."""
    settings = board.selftest
    prompt = golden_prompt(plan, settings.prompt_tokens)
    ref = Reference(plan, map_image(weights)).generate(prompt, settings.steps, SamplingParams(), stop_at_eos=False)
    return Golden(prompt, ref.tokens, ref.digests)


def render_golden(golden: Golden, board: Board) -> str:
    context = dict(golden=golden, digests=golden.c_digests(), board=board, comment=c_comment)
    return environment().get_template(GOLDEN_TEMPLATE).render(context)


def render_checks(plan: Plan) -> str:
    return environment().get_template(CHECKS_TEMPLATE).render(checks=checked_types(plan), quant=plan.quant)


def write_golden(plan: Plan, weights: Path, board: Board, out: Path) -> Golden:
    """selftest_data.c for the image at `weights`, and selftest_checks.h beside it (the block types
    whose kernels are checked), each written whole or not at all."""
    golden = golden_run(plan, weights, board)
    write_atomic(out.parent / CHECKS_FILE, render_checks(plan).encode())
    write_atomic(out, render_golden(golden, board).encode())
    return golden


@dataclass(frozen=True)
class SelftestCheck(JsonDocument):
    """One of the self-test's checks, as `./colibri selftest` lists it: what was checked, and what
    differed (empty when it passed)."""

    name: str
    checked: str
    passed: bool = json_field(key="pass")
    differed: str = ""


def selftest_checks(frame: Selftest, plan: Plan, golden_steps: int) -> list[SelftestCheck]:
    """The self-test frame's verdict check by check: the weight image, the kernels against the
    scalar ones, the golden decode (a check not reached after an earlier failure did not pass)."""
    f = frame.fields
    image_ok = "image" not in f
    kernels = kernel_checks(plan)
    count = f.get("kernels_checked", "?")
    names = ", ".join(dict.fromkeys(kernels)) if count == str(len(kernels)) else "this build's kernels"
    decode_ok = image_ok and "decode_error" not in f and "step" not in f
    decoded = {k: v for k, v in f.items() if k in ("decode_error", "step", "token", "expected", "logits")}
    return [
        SelftestCheck(
            "weight image",
            "the image's header, model hash and CRC-32s, as the loader checks them",
            image_ok,
            "" if image_ok else f["image"],
        ),
        SelftestCheck(
            "kernels",
            f"{count} comparisons of the {f.get('kernels', '?')} kernel set against the scalar kernels on fixed inputs: {names}",
            "kernel_failed" not in f,
            f"{f['kernel_failed']} differs from the scalar kernel" if "kernel_failed" in f else "",
        ),
        SelftestCheck(
            "golden decode",
            f"a greedy decode of the golden prompt, {golden_steps} steps: every token and the SHA-256 of every "
            "step's logits against the NumPy reference's, computed at build time",
            decode_ok,
            "not run: the weight image was refused" if not image_ok else Selftest(False, decoded).what,
        ),
    ]
