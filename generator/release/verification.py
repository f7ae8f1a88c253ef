"""The verify run a release records: this exact firmware's decode against the NumPy reference
(verify.py), and whether its hello frame names these very files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..boards import Board
from ..compile.plan import Plan
from ..device.links import Firmware, LinkOptions
from ..device.runner import run_firmware
from ..device.session import RunRequest, RunResult
from ..reference import Generation
from ..verify import firmware_identity, instructions_scope, rates, reference_run, verify_run
from .bundle import RELEASE_FORMAT
from .provenance import request_dict

if TYPE_CHECKING:
    from ..compile.build import Artifacts

# Hello-frame fields that describe the firmware itself, recorded in verification.json. The others
# describe the machine it ran on (e.g. `kernels`, chosen at run time from the CPU's features) and go
# to <name>.measurements.json.
# Selftest-frame fields that depend on the machine it ran on, not on the firmware.
SELFTEST_MACHINE = ("kernels", "us", "instret")  # a boot run's count includes the UART interrupts of the host's request
HELLO_IDENTITY = ("proto", "fw", "board", "arch", "quant", "ctx", "vocab", "model", "weights", "build")


def decoded(run: RunResult | Generation) -> dict[str, Any]:
    """A decode as verification.json records it: its MoE routing counts only when it has some."""
    out: dict[str, Any] = {"tokens": run.tokens, "logits_sha256": run.digests, "stop_reason": run.stop_reason}
    if run.expert_counts:
        out["expert_counts"] = {str(k): v for k, v in run.expert_counts.items()}
    return out


def verify_firmware(
    board: Board, art: Artifacts, plan: Plan, request: RunRequest, hosts: tuple[str, ...] = ()
) -> tuple[dict, dict]:
    """(verification.json, measurements) for this exact firmware: verify.verify_run, the one verify,
    on boards that run here (a build for several MPI ranks: its ranks on `hosts`, each with its own
    image); on the others the reference's result a board must reproduce."""
    verification: dict[str, Any] = {
        "format": RELEASE_FORMAT,
        "board": board.name,
        "quant": plan.quant,
        "n_ctx": plan.n_ctx,
        "request": request_dict(request),
    }
    if not board.runner.runs_here:
        verification.update(
            reference=decoded(reference_run(plan, art.weights, request)),
            ran=False,
            passed=None,
            reason=(
                f"board {board.name} runs on hardware over a serial port; nothing ran this firmware here. "
                f"`./colibri verify --board {board.name} --port PORT` with this request must reproduce the "
                f"reference's tokens and logits hashes"
            ),
        )
        return verification, {"ran": False}

    firmware = Firmware(art.program, art.weights, art.model_hash(), art.flash_image, None, art.rank_weights())

    def run(asked: RunRequest) -> RunResult:
        return run_firmware(board, firmware, LinkOptions(hosts=hosts), asked)

    result = run(request)
    # The hello frame must name these very files: board, quantization, context, the weight image's
    # SHA-256 and the ELF's build id (the check `verify` makes on a port); the firmware's own check
    # (app/selftest.c): the boot run's frame on MCU boards, else asked.
    verified = verify_run(
        board,
        plan,
        art.weights,
        firmware_identity(board, art, plan),
        request,
        result,
        lambda: run(RunRequest.selftest_of(board.selftest)).selftest,
    )
    selftest = verified.selftest
    s = result.stats
    hello = {k: v for k, v in result.hello.items() if k in HELLO_IDENTITY}
    verification.update(
        reference=decoded(verified.reference),
        ran=True,
        passed=verified.passed and selftest is not None,
        first_divergent_step=verified.comparison.first_divergent_step,
        hello=hello,
        firmware=decoded(result),
    )
    if verified.identity_problems:
        verification["identity_problems"] = verified.identity_problems
    # What the run machine chose (the kernel set, the microseconds) goes to the measurements; the
    # rest, the exact instructions on an emulated MCU included, is what a rebuild must reproduce.
    verification["selftest"] = (
        None
        if selftest is None
        else {"pass": selftest.passed, **{k: v for k, v in selftest.fields.items() if k not in SELFTEST_MACHINE}}
    )
    n_prompt, n_decode = int(s.get("prompt", 0)), int(s.get("decode", 0))
    if "prefill_instret" in s and "decode_instret" in s:
        # Exact under qemu's -icount shift=0: part of what a rebuild must reproduce.
        pre, dec = int(s["prefill_instret"]), int(s["decode_instret"])
        verification["instructions"] = {
            "prompt_tokens": n_prompt,
            "decode_forward_passes": n_decode,
            "prefill": pre,
            "decode": dec,
            "prefill_per_token": pre / n_prompt if n_prompt else None,
            "decode_per_token": dec / n_decode if n_decode else None,
            "counted": instructions_scope(request, result),
        }

    r = rates(result)
    measurements = {
        "ran": True,
        "emulated_by": board.runner.emulated_by(),
        "run_machine": {k: v for k, v in result.hello.items() if k not in HELLO_IDENTITY},
        "wall_seconds": round(result.wall_seconds, 6),
        **{k: int(s.get(k, 0)) for k in ("prefill_us", "decode_us", "forward_us")},
        "prompt_tokens": r.prompt_tokens,
        "decode_forward_passes": r.decode_forward_passes,
        "prefill_tok_s": r.prefill_tok_s,
        "decode_tok_s": r.decode_tok_s,
        "forward_tok_s": r.forward_tok_s,
        "selftest": {k: v for k, v in (selftest.fields if selftest else {}).items() if k in SELFTEST_MACHINE},
    }
    return verification, measurements
