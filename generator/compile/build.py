"""Build stage driver: checks the request in Python (clear errors before any compiling), then
runs SCons, which generates the sources (pipeline.generate) and cross-builds them for the board."""

from __future__ import annotations

import difflib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..boards import DEFAULT_KV_TYPE, Board, available_boards, board_reference
from ..errors import ColibriError
from ..files import REPO, slug
from ..model.gguf import is_gguf
from ..model.load import load_model, model_name
from ..numerics.quantize import QUANTS
from . import build_cache
from .module_inputs import modules_run_by
from .pipeline import PLAN_FILE, WEIGHTS_FILE, generate, plan_checkpoint
from .plan import Plan, check_fits

GENERATED_DIR = "generated"
# Model files at least this large (checkpoint shards) count as unchanged while their size and
# modification time are: the build never reads them to decide (model_input_signature).
LARGE_INPUT_BYTES = 16 << 20


@dataclass(frozen=True)
class BuildRequest:
    board: Board
    model_dir: Path
    quant: str
    n_ctx: int
    out_dir: Path
    kv_type: str = DEFAULT_KV_TYPE
    ranks: int = 1  # MPI ranks: one weight image each (compile/layout.py rank_image)


@dataclass(frozen=True)
class Artifacts:
    out_dir: Path
    program: Path
    weights: Path
    plan_json: Path
    generated: Path
    flash_image: Path | None  # what an emulator maps as the board's flash (mapped-weights boards)

    def plan(self) -> dict:
        return json.loads(self.plan_json.read_text())

    def rank_weights(self) -> tuple[Path, ...]:
        """Each rank's weight image, rank 0 first; none for a single board's build."""
        from .layout import rank_image_name

        ranks = self.plan().get("ranks", {}).get("count", 1)
        return tuple(self.generated / rank_image_name(r) for r in range(ranks)) if ranks > 1 else ()

    def model_hash(self) -> str:
        from .image import map_image, read_header

        return read_header(map_image(self.weights)).model_hash.hex()


# Where builds go unless --out says otherwise: build/ in the checkout, or $COLIBRI_BUILD_DIR (a
# read-only checkout, a faster disk, or one directory per parallel test worker).
BUILD_ROOT = Path(os.environ.get("COLIBRI_BUILD_DIR") or REPO / "build").resolve()


def default_out_dir(
    board: Board, model_dir: Path, quant: str, n_ctx: int, kv_type: str | None = None, ranks: int = 1
) -> Path:
    """build/<board>/<model>-<quant>-ctx<N>: where a build goes unless --out says otherwise
    (-kv<type> after it for a KV cache type other than the board's, -ranks<N> for several ranks)."""
    kv = f"-kv{kv_type}" if kv_type and kv_type != board.kv_type else ""
    split = f"-ranks{ranks}" if ranks > 1 else ""
    return BUILD_ROOT / board.name / f"{model_slug(model_dir)}-{quant}-ctx{n_ctx}{kv}{split}"


def model_slug(model: Path | str) -> str:
    """A model's name in its build directories: the directory's name (a snapshot in the hub's
    cache by its repository's), or the file's, a GGUF file's extension left out (its quantization
    follows: SmolLM2-135M-Instruct.Q4_1-gguf-ctx512)."""
    path = Path(model).resolve()
    return slug(path.stem if is_gguf(path) else model_name(path))


# Written into every build directory when the build makes it: what tells a build directory (which
# a build may overwrite) from a user's directory that happens to be named by --out. A directory
# SCons has built in (its .sconsign.dblite) counts too.
BUILD_DIR_MARKER = ".colibri-build"
SCONS_DATABASE = ".sconsign.dblite"


def _named_directory(text: str | Path, flag: str) -> Path:
    """`flag`'s value as a path that names a directory (not empty, not an existing file)."""
    if str(text) == "":
        raise ColibriError(f"{flag} is empty: name a directory, or leave the option out for the default one")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ColibriError(f"{flag} {path}: exists and is not a directory; name a directory")
    return path


def check_out_dir(text: str | Path, flag: str = "--out") -> Path:
    """An output directory the user names (`flag`), checked before any work: not empty, not a
    file, its parent there, and a directory can be made or written in it (a probe directory is
    made and removed: a read-only disk, /proc or /sys refuse it whatever the permission bits say).
    Every command's --out comes through here (arguments.out_dir, the release)."""
    path = _named_directory(text, flag)
    where = path.absolute()
    holder = where if where.is_dir() else where.parent
    if not holder.is_dir():
        what = "is not a directory" if holder.exists() else "does not exist"
        raise ColibriError(f"{flag} {path}: its parent {holder} {what}; create it first or choose another {flag}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".colibri-probe-", dir=holder))
    except OSError as e:
        raise ColibriError(f"{flag} {path}: cannot write in {holder} ({e.strerror}); choose another {flag}") from None
    return path


def check_build_dir(text: str | Path, flag: str = "--out") -> None:
    """A build may go into a new or empty directory, or one a build made: never into a directory
    of the user's own files, whose `firmware` or `generated/` it would overwrite. (Where it may be
    made is check_out_dir's, on what the user names; a build inside the program's own temporary
    directories has its parents made for it.)"""
    out_dir = _named_directory(text, flag)
    if not out_dir.is_dir() or (out_dir / BUILD_DIR_MARKER).exists() or (out_dir / SCONS_DATABASE).exists():
        return
    held = sorted(p.name for p in out_dir.iterdir())
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ColibriError(
            f"{flag} {out_dir}: holds files a build did not make ({shown}); the build would overwrite them: "
            f"name a new or empty directory, or a previous build's"
        )


def make_build_dir(out_dir: Path) -> None:
    """Create the build directory (and its parents) with the marker that makes it a build's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / BUILD_DIR_MARKER).touch()


def prepare(
    board: Board,
    model_dir: Path | str,
    quant: str | None,
    ctx: int | None,
    out_dir: Path | str | None = None,
    check_fit: bool = True,
    kv_type: str | None = None,
    ranks: int = 1,
) -> tuple[BuildRequest, Plan]:
    """Validate everything that can be validated without compiling; returns the plan too.
    quant None: the model's default (a GGUF file's own blocks, else q8_0); kv_type None: the board's.
    check_fit=False leaves the memory budgets to the caller (`report` shows the table first)."""
    if out_dir is not None:
        check_build_dir(out_dir)  # before any work: a bad --out costs nothing
    model_dir = Path(model_dir)
    checkpoint = load_model(model_dir, load_tensors=False)
    plan = plan_checkpoint(checkpoint, model_dir, board, quant, ctx, kv_type, ranks)
    quant, n_ctx = plan.quant, plan.n_ctx
    if check_fit:
        check_fits(board, plan)
    if out_dir is None:
        out_dir = default_out_dir(board, model_dir, quant, n_ctx, plan.kv_type, plan.ranks)
    request = BuildRequest(board, model_dir.resolve(), quant, n_ctx, Path(out_dir).resolve(), plan.kv_type, plan.ranks)
    return request, plan


def generation_modules() -> list[Path]:
    """The generator's files that generation runs on: pipeline.generate and the board it is given,
    with every module they import. SCons's inputs of the generated files, so an edit of cli.py or
    bench.py quantizes nothing again."""
    return modules_run_by(generate.__module__, Board.__module__)


def model_input_signature(paths: list[Path]) -> tuple[list[Path], str]:
    """The generation's model inputs as SCons sees them: the small files (hashed by content), and
    one line naming each large file by its size and modification time (nanoseconds). A no-op build
    of a 50 GB model then reads none of it, nor does SCons hash it again after generating; any
    change to a large file's size or time (an edit, a copy, a touch) regenerates."""
    small, stamps = [], []
    for p in paths:
        st = p.stat()
        if st.st_size >= LARGE_INPUT_BYTES:
            stamps.append(f"{p.name} size={st.st_size} mtime_ns={st.st_mtime_ns}")
        else:
            small.append(p)
    return small, "\n".join(stamps)


def image_signature(path: Path | str) -> str | None:
    """What SCons records for a weight image it built, instead of hashing every byte (110 s for a
    17.5 GB image after each generation): the image's identity, the SHA-256 of its header and
    directory, which hold the model hash over every data byte and each tensor's CRC-32, and its
    size. None for a file that is not a readable image (SCons then hashes it as any file)."""
    from . import image

    try:
        blob = image.map_image(path)
        return f"colibri-image {image.identity_sha256(blob).hex()} {len(blob)}"
    except (ColibriError, OSError, ValueError):
        return None


def check_board_to_clean(board: str, root: Path | None = None) -> None:
    """`clean --board BOARD` names a board of targets/ or one with builds under root (a board file
    of one's own builds into build/<its name>/): an empty or unknown name is refused, never taken
    as "every board" or "nothing to clean"."""

    root = BUILD_ROOT if root is None else root
    built = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    known = sorted(set(available_boards()) | set(built))
    if board in known:
        return
    if not board:
        raise ColibriError(
            f"--board is empty: name a board (known: {', '.join(known)}), or leave --board out to clean every board"
        )
    closest = difflib.get_close_matches(board, known, n=1)
    hint = f"did you mean {closest[0]}? " if closest else ""
    raise ColibriError(f"unknown board {board!r}: {hint}known boards: {', '.join(known)}")


def changed_outside_build(output) -> bool:
    """Whether a build output (an SCons file node) is no longer the file SCons recorded making:
    its size or modification time differ from those in the node's stored info. A file never built,
    or missing (SCons rebuilds it anyway), is not."""
    recorded = getattr(output.get_stored_info(), "ninfo", None)
    size, timestamp = getattr(recorded, "size", None), getattr(recorded, "timestamp", None)
    if size is None or timestamp is None or not output.exists():
        return False
    return (output.get_size(), output.get_timestamp()) != (size, timestamp)


def build_dirs(board: str | None = None, model: Path | str | None = None, root: Path | None = None) -> list[Path]:
    """The build directories under build/ (all, one board's, one model's, or one model's on one
    board): what `./colibri clean` removes. Builds elsewhere (--out) are the user's own."""
    root = BUILD_ROOT if root is None else root
    if board is not None:
        check_board_to_clean(board, root)
    if not root.is_dir():
        return []
    boards = [root / board] if board is not None else sorted(p for p in root.iterdir() if p.is_dir())
    prefix = f"{model_slug(model)}-" if model is not None else None
    found = []
    for board_dir in boards:
        if not board_dir.is_dir():
            continue
        if prefix is None:
            found.append(board_dir)
        else:
            found += sorted(
                d
                for d in board_dir.iterdir()
                if d.is_dir() and d.name.startswith(prefix) and d.name[len(prefix) :].split("-ctx")[0] in QUANTS
            )
    return found


def remove_builds(dirs: list[Path], root: Path | None = None) -> int:
    """Remove `dirs` (build directories under root) and whatever they leave behind: empty board
    directories and a build/compile_commands.json that pointed into them. Returns the bytes freed."""
    root = BUILD_ROOT if root is None else root
    freed = 0
    for d in dirs:
        if not d.resolve().is_relative_to(root.resolve()) or d.resolve() == root.resolve():
            raise ColibriError(f"refusing to remove {d}: not a build directory under {root}")
        freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(d)
        parent = d.parent
        if parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    link = root / "compile_commands.json"
    if link.is_symlink() and not link.exists():
        link.unlink()
    return freed


def artifacts(req: BuildRequest) -> Artifacts:
    gen = req.out_dir / GENERATED_DIR
    flash = gen / WEIGHTS_FILE if req.board.weights == "mapped" else None
    return Artifacts(req.out_dir, req.out_dir / req.board.program, gen / WEIGHTS_FILE, gen / PLAN_FILE, gen, flash)


def scons_command(req: BuildRequest, extra: list[str] | None = None) -> list[str]:
    scons = Path(sys.executable).parent / "scons"
    return [
        str(scons),
        "-Q",
        "-C",
        str(REPO),
        f"board={board_reference(req.board)}",
        f"model={req.model_dir}",
        f"quant={req.quant}",
        f"ctx={req.n_ctx}",
        f"kv_type={req.kv_type}",
        *([f"ranks={req.ranks}"] if req.ranks > 1 else []),
        f"out={req.out_dir}",
        *(extra or []),
    ]


def run_scons(
    req: BuildRequest,
    echo=None,
    defines: tuple[str, ...] = (),
    jobs: int | None = None,
    cache_dir: str | Path | None = None,
) -> Artifacts:
    """Run the SCons build; progress lines go to `echo`. A failure raises ColibriError and, when
    this run created the build directory, removes it: a refused model leaves nothing behind.
    `defines` (NAME or NAME=VALUE) are extra preprocessor definitions, for test and diagnostic
    builds such as a slower loader (SCons's `defines=` argument). `jobs`: the worker processes
    that quantize the weights if they are generated and compile (SCons's `jobs=`; default: two
    quantizing and one compiling per core).
    `cache_dir`: the build cache (build_cache.py; None: the default one, "off": none)."""
    cache = build_cache.prepare_cache_dir(build_cache.resolve_cache_dir(cache_dir))
    fresh = not req.out_dir.exists()
    extra = [f"defines={','.join(defines)}"] if defines else []
    if jobs is not None:
        extra.append(f"jobs={jobs}")
    if cache is not None:
        extra.append(f"cache_dir={cache}")
    try:
        made = _run_scons(req, echo, extra)
    except BaseException:
        if fresh:
            shutil.rmtree(req.out_dir, ignore_errors=True)
        raise
    link_compile_commands(req.out_dir, BUILD_ROOT)
    build_cache.trim_cache(cache)
    return made


def link_compile_commands(out_dir: Path, build_root: Path) -> None:
    """Point build/compile_commands.json at the latest build under build/: clangd looks for the
    database in a `build` directory above the sources, so firmware_src/ opens with that build's
    flags and generated headers."""
    database = out_dir / "compile_commands.json"
    if not out_dir.is_relative_to(build_root) or not database.is_file():
        return
    link = build_root / "compile_commands.json"
    partial = build_root / ".compile_commands.json.partial"
    partial.unlink(missing_ok=True)
    partial.symlink_to(database.relative_to(build_root))
    os.replace(partial, link)


def cache_hit_line(line: str) -> str:
    """SCons's "Retrieved `obj/x.o' from cache" as a progress line shaped like the others."""
    hit = re.fullmatch(r"Retrieved `(.*)' from cache", line)
    return f"  CACHED  {hit.group(1)}" if hit else line


# How long a build's processes have after SIGTERM, when the CLI ends before them, before SIGKILL.
STOP_GRACE_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec_fn: the child is killed (SIGKILL) when the CLI dies, even by SIGKILL, where no
    handler of the CLI's can run. Linux's prctl, looked up here: the child, between fork and exec,
    only calls it. None where there is no prctl."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the CLI died before the prctl: nobody would signal it now
            os._exit(1)

    return arm


def stop_group(proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """End a child that leads its own process group, and everything it started: SIGTERM to the
    group, then SIGKILL to it after `grace` (SCons blocked on a FIFO ignores SIGTERM)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGKILL:
            return
        try:  # the leader has gone; what it started may linger in the group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def _terminated(signum, frame):
    # SIGTERM as an exception, so run_echoing's cleanup runs (Python's default ends at once).
    raise SystemExit(128 + signum)


# The longest the CLI's main thread waits on a command's output at a time. A signal meant for the
# CLI (Ctrl-C, SIGTERM) may be handed by the kernel to any of its threads (numpy's BLAS threads,
# a progress timer); Python then runs its handler in the main thread only when that thread runs
# again, which a read blocked on a silent build (SCons waiting on a FIFO) never would.
SIGNAL_WAKE_SECONDS = 0.25


def _lines_waking(fd: int) -> Iterator[str]:
    """The lines read from fd until its end (UTF-8, undecodable bytes replaced), the main thread
    woken at least every SIGNAL_WAKE_SECONDS so a pending signal's handler runs."""
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], SIGNAL_WAKE_SECONDS)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data = pending + chunk
        held = b"\r" if data.endswith(b"\r") else b""  # it may start a CR LF the next chunk ends
        data = data[: len(data) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")  # as text mode reads
        *complete, pending = data.split(b"\n")
        pending += held
        for raw in complete:
            yield raw.decode("utf-8", "replace")
    if pending.rstrip(b"\r"):
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def run_echoing(
    command: list[str], env: dict, echo_line: Callable[[str], None], cannot_run: Callable[[str], str], **popen
) -> tuple[int, list[str]]:
    """Run command (stderr into stdout), each output line to echo_line as it comes; its exit code and lines.
    A command that cannot start is a ColibriError: cannot_run(its strerror). The command runs in its
    own process group, ended with everything in it when the CLI ends first (an error, Ctrl-C,
    SIGTERM; SIGKILL ends the command itself)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main_thread else None
    try:
        try:
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                errors="replace",
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()) if in_main_thread else None,
                **popen,
            )
        except OSError as e:
            raise ColibriError(cannot_run(e.strerror)) from None
        try:
            lines = []
            for line in _lines_waking(proc.stdout.fileno()):
                lines.append(line)
                echo_line(line)
            proc.wait()
        finally:
            if proc.poll() is None:
                stop_group(proc)
            proc.stdout.close()
        return proc.returncode, lines
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


# How long a build's progress line is held back before it is shown: a build refused within this
# time of its last progress line says only its one error line.
PROGRESS_HOLD_SECONDS = 2.0


class HeldProgress:
    """Progress lines shown PROGRESS_HOLD_SECONDS after they come (at once when the build ends
    well: flush), or never when it fails first (drop): a refused build's output is its error
    line alone, a long build still shows where it is."""

    def __init__(self, echo: Callable[[str], None], hold: float = PROGRESS_HOLD_SECONDS):
        self.echo, self.hold = echo, hold
        self.pending: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def add(self, line: str) -> None:
        with self.lock:
            self.pending.append((time.monotonic() + self.hold, line))
            if self.timer is None:
                self._start(self.hold)

    def _start(self, delay: float) -> None:
        self.timer = threading.Timer(delay, self._due)
        self.timer.daemon = True
        self.timer.start()

    def _due(self) -> None:
        with self.lock:
            now = time.monotonic()
            while self.pending and self.pending[0][0] <= now:
                self.echo(self.pending.pop(0)[1])
            self.timer = None
            if self.pending:
                self._start(max(0.0, self.pending[0][0] - now))

    def _stop(self) -> list[str]:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            lines = [line for _, line in self.pending]
            self.pending = []
            return lines

    def flush(self) -> None:
        for line in self._stop():
            self.echo(line)

    def drop(self) -> None:
        self._stop()


def progress_line(line: str) -> str | None:
    """A line of SCons's output as the build's progress shows it, or None: only the progress lines
    (SConstruct's indented `  GEN  ...`, `  CC  ...`, cache hits), never SCons's own `scons: ***`
    lines, the error line the CLI prints itself, or a warning."""
    shown = cache_hit_line(line)
    return shown if shown.startswith("  ") and shown.strip() else None


def spawn_argument_list(sh: str, escape, cmd: str, args: list[str], env: dict) -> int:
    """SCons's SPAWN for the SConstruct: the compiler and linker started with their argument list
    as SCons substituted it, never through `sh -c` (SCons's own joins the arguments into one shell
    command, so a flag with a backtick or `;` would run). A program that cannot start is one line."""
    try:
        return subprocess.run(list(args), env={k: str(v) for k, v in env.items()}, close_fds=True).returncode
    except OSError as e:
        print(f"colibri: error: cannot run {args[0]}: {e.strerror}", file=sys.stderr)
        return 127


def _run_scons(req: BuildRequest, echo, extra: list[str]) -> Artifacts:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    # Python's warnings (NumPy's on odd weights) are no message for the user: what is wrong with a
    # model is said by the build's one error line.
    env.setdefault("PYTHONWARNINGS", "ignore")
    held = HeldProgress(echo) if echo else None

    def echo_line(line: str) -> None:
        shown = progress_line(line)
        if held is not None and shown is not None:
            held.add(shown)

    try:
        returncode, lines = run_echoing(
            scons_command(req, extra),
            env,
            echo_line,
            lambda strerror: f"cannot run SCons ({strerror}); ./colibri installs it into .venv",
            cwd=REPO,  # where -C points, so SCons says nothing of entering it; every path it gets is absolute
        )
    except BaseException:
        if held is not None:
            held.drop()
        raise
    if returncode != 0:
        if held is not None:
            held.drop()
        for line in lines:
            if line.startswith("colibri: error: "):
                raise ColibriError(line[len("colibri: error: ") :])
        tail = "\n".join(lines[-30:])
        raise ColibriError(f"the build for board {req.board.name} failed:\n{tail}")
    if held is not None:
        held.flush()
    return artifacts(req)
