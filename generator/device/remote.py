"""Linux boards reached over SSH (`--remote [user@]host[:port]`), through the system's OpenSSH client
in batch mode: ~/.ssh/config aliases, keys, the agent and known_hosts all work, and nothing ever
asks for a password or a host key.

A run opens one connection per step, and the copy step only when the board lacks a file:
  1. look: the board's `uname -m` (refused before anything is copied when it is not the board
     file's ISA), which of the firmware and the weight image its cache already holds, the free
     space there (refused before copying, with the numbers), the remote prefix's program;
  2. copy each missing file into the cache, content-addressed (<cache>/<sha256>): written under a
     temporary name, checked on the board for its size and SHA-256, renamed when complete, so an
     interrupted copy never looks complete and an unchanged 300 MB image is never sent again;
  3. run: the request frame goes to the firmware's stdin over the channel and its frames come back
     through the same reader as a local run's (device/process.py).

Settings, from the environment:
  COLIBRI_REMOTE         the default for --remote, for every Linux board (an empty value: run locally)
  COLIBRI_CONFIG         the user config file; default $XDG_CONFIG_HOME/colibri/config.toml, else
                         ~/.config/colibri/config.toml, whose [remote] table gives a default per
                         board (linux-aarch64 = "rock5b") when COLIBRI_REMOTE is not set
  COLIBRI_REMOTE_CACHE   the cache directory on the board (default ~/.cache/colibri)
  COLIBRI_REMOTE_PREFIX  replaces the board file's remote_prefix ("qemu-aarch64"; empty: none)
  COLIBRI_SSH_COMMAND    the ssh command and options (default "ssh"; e.g. "ssh -F my_config")
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..boards import Board, ProcessRunner, available_boards, load_board
from ..errors import ColibriError
from ..files import load_toml
from .process import run_process, signal_name
from .session import RemoteRun, RunRequest, RunResult, Session, request_frame

DEFAULT_CACHE = "~/.cache/colibri"

# Batch mode: a missing key or an unknown host key fails at once instead of prompting. The keepalives
# notice a board that vanished (power, network) within 15 s instead of TCP's minutes.
SSH_OPTIONS = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ClearAllForwardings=yes",
    "-o",
    "LogLevel=ERROR",
)

# What `uname -m` may answer for a board file's ISA.
MACHINE_NAMES = {"x86_64": ("x86_64", "amd64"), "aarch64": ("aarch64", "arm64")}


def runs_on(isa: str, machine: str) -> bool:
    return machine in MACHINE_NAMES.get(isa, (isa,))


_SPEC = re.compile(
    r"(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.-]*)@)?"
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_][A-Za-z0-9_.-]*))"
    r"(?::(?P<port>[0-9]{1,5}))?"
)


@dataclass(frozen=True)
class Remote:
    host: str  # an ~/.ssh/config alias, a name or an address
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")

    def ssh_args(self) -> list[str]:
        """The ssh command up to and including the destination."""
        return [
            *ssh_command(),
            *(["-p", str(self.port)] if self.port else []),
            *(["-l", self.user] if self.user else []),
            self.host,
        ]

    def ssh_argv(self, script: str) -> list[str]:
        """ssh running `script` on the board under sh, whatever the login shell is."""
        args = self.ssh_args()
        return [*args[:-1], *SSH_OPTIONS, "--", args[-1], "sh -c " + shlex.quote(script)]


def parse_remote(text: str, source: str = "--remote") -> Remote:
    m = _SPEC.fullmatch(text)
    port = int(m.group("port")) if m and m.group("port") else None
    if not m or (port is not None and not 1 <= port <= 65535):
        raise ColibriError(
            f"{source}: expected [user@]host[:port] (an ~/.ssh/config alias, a name or an address), got {text!r}"
        )
    return Remote(m.group("ipv6") or m.group("host"), m.group("user"), port)


def ssh_command() -> list[str]:
    text = os.environ.get("COLIBRI_SSH_COMMAND", "").strip()
    try:
        return shlex.split(text) if text else ["ssh"]
    except ValueError as e:
        raise ColibriError(f"COLIBRI_SSH_COMMAND: {e}") from None


def remote_cache() -> str:
    return os.environ.get("COLIBRI_REMOTE_CACHE", "").strip() or DEFAULT_CACHE


def remote_prefix(board: Board) -> tuple[str, ...]:
    """What the firmware runs under on the board: COLIBRI_REMOTE_PREFIX if set, else the board file's."""
    text = os.environ.get("COLIBRI_REMOTE_PREFIX")
    if text is None:
        return board.runner.remote_prefix if isinstance(board.runner, ProcessRunner) else ()
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ColibriError(f"COLIBRI_REMOTE_PREFIX: {e}") from None


def config_path() -> Path:
    if os.environ.get("COLIBRI_CONFIG"):
        return Path(os.environ["COLIBRI_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "colibri" / "config.toml"


def default_remote(board_name: str) -> tuple[str, str] | None:
    """(the default remote for a board, where it came from): COLIBRI_REMOTE, else the user config's
    [remote] entry for the board; None when neither gives one."""
    if "COLIBRI_REMOTE" in os.environ:
        return os.environ["COLIBRI_REMOTE"].strip(), "COLIBRI_REMOTE"
    path = config_path()
    if not path.is_file():
        return None
    try:
        table = load_toml(path, str(path)).get("remote", {})
    except tomllib.TOMLDecodeError as e:
        raise ColibriError(f"{path}: malformed config file ({e})") from None
    value = table.get(board_name) if isinstance(table, dict) else None
    if value is None:
        return None
    if not isinstance(value, str):
        raise ColibriError(f'{path}: [remote] {board_name} must be a string such as "user@host:port"')
    return value.strip(), f"{path} [remote] {board_name}"


def remote_for(board: Board, given: str | None) -> Remote | None:
    """The board to run on: --remote when given (an empty value: run here), else the default; None
    runs locally. A default names boards reached over SSH, so it never applies to an MCU board."""
    if given is not None:
        text, source = given.strip(), "--remote"
    else:
        found = default_remote(board.name)
        if found is None:
            return None
        text, source = found
    if not text:
        return None
    if not board.runner.takes_remote:
        if given is None:
            return None
        raise ColibriError(f"--remote is for Linux boards (host, linux-aarch64); {board.name} is not one")
    return parse_remote(text, source)


# ---- failures ---------------------------------------------------------------------------------


def ssh_failure(remote: Remote, stderr: str, doing: str) -> str:
    """One line for an ssh that ended with status 255 (its own failure, not the command's)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no message from ssh"
    text = "\n".join(lines)
    hint = shlex.join(remote.ssh_args())
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (
            f"the host key of {remote} has changed since it was recorded in known_hosts: if the board was "
            f"reinstalled, remove the old key with `ssh-keygen -R {remote.host}` and accept the new one with "
            f"`{hint}`"
        )
    if "Host key verification failed" in text or "host key is known" in text:
        # ssh-keyscan reads no ssh config: give it the address and port an alias stands for.
        resolved = ssh_settings(remote)
        port = resolved.get("port", str(remote.port or 22))
        keyscan = shlex.join(
            ["ssh-keyscan", *(["-p", port] if port != "22" else []), resolved.get("hostname", remote.host)]
        )
        known_hosts = resolved.get("userknownhostsfile", "~/.ssh/known_hosts").split()[0]
        return (
            f"the host key of {remote} is not in known_hosts (ssh runs in batch mode, which never asks): "
            f"check its fingerprint and accept it once with `{hint}`, or add it with "
            f"`{keyscan} >> {known_hosts}`"
        )
    if "Permission denied" in text or "Too many authentication failures" in text:
        return (
            f"{remote} refused the login ({last.rstrip('.')}): colibri logs in with keys or the agent only, "
            f"never a password; install your public key on the board (ssh-copy-id) or name the key in "
            f"~/.ssh/config"
        )
    if re.search(r"Could not resolve hostname|connect to host|Network is unreachable|No route to host", text):
        return f"cannot reach {remote}: {last}"
    if re.search(
        r"closed by remote host|Connection closed|Connection reset|Broken pipe|not responding|"
        r"timed out|Connection timed out",
        text,
    ):
        return f"the connection to {remote} dropped {doing}: {last}"
    return f"ssh to {remote} failed {doing}: {last}"


def ssh_settings(remote: Remote) -> dict[str, str]:
    """What ssh's configuration makes of the destination (`ssh -G`: hostname, port, known hosts...)."""
    args = remote.ssh_args()
    try:
        done = subprocess.run(
            [*args[:-1], "-G", "--", args[-1]], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    return {key: value for key, _, value in (line.partition(" ") for line in done.stdout.splitlines())}


def ssh_run(remote: Remote, script: str, doing: str) -> subprocess.CompletedProcess:
    """Run a short script on the board; ssh's own failures become their one line."""
    argv = remote.ssh_argv(script)
    if shutil.which(argv[0]) is None:
        raise ColibriError(
            f"--remote needs the OpenSSH client ({argv[0]} is not on PATH): apt-get install openssh-client"
        )
    done = subprocess.run(argv, input=b"", capture_output=True)
    if done.returncode == 255:
        raise ColibriError(ssh_failure(remote, done.stderr.decode("utf-8", "replace"), doing))
    return done


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


# ---- deployment ---------------------------------------------------------------------------------


def shell_path(path: str) -> str:
    """A board path for sh: ~ is the login's home there, not here."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


_hashes: dict[tuple, str] = {}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered for an unchanged file (bench runs the same files --repeat times)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hashes:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _hashes[key] = h.hexdigest()
    return _hashes[key]


@dataclass(frozen=True)
class Blob:
    what: str  # "firmware" | "weights": the key of bytes_sent
    label: str  # for messages
    path: Path
    sha256: str
    size: int
    mode: str  # chmod on the board


@dataclass
class Deployment:
    cache: str  # the cache directory on the board, absolute
    machine: str  # its uname -m
    sent: dict[str, int]  # bytes copied per blob kind


def look(remote: Remote, cache: str, blobs: list[Blob], prefix: tuple[str, ...]) -> dict:
    """One connection: the board's machine, which blobs its cache holds, its free space, the prefix."""
    script = "; ".join(
        [
            "printf 'colibri-machine %s\\n' \"$(uname -m)\"",
            f"d={shell_path(cache)}",
            'mkdir -p "$d" && cd "$d" || exit 3',
            # Copies cut short by a lost board (no trap runs on a power cut) are never used; tidy them.
            "find . -maxdepth 1 -name '.*.partial.*' -mmin +60 -exec rm -f {} + 2>/dev/null",
            "printf 'colibri-cache %s\\n' \"$(pwd)\"",
            f"for f in {' '.join(b.sha256 for b in blobs)}; do "
            'if [ -f "$f" ]; then printf \'colibri-have %s\\n\' "$f"; fi; done',
            "printf 'colibri-space %s\\n' \"$(df -Pk . | tail -n 1)\"",
            *(
                [f"if command -v {shlex.quote(prefix[0])} >/dev/null 2>&1; then echo colibri-prefix; fi"]
                if prefix
                else []
            ),
            "exit 0",
        ]
    )
    done = ssh_run(remote, script, "while connecting")
    if done.returncode == 3:
        raise ColibriError(
            f"cannot use the cache directory {cache} on {remote}: {_last_line(done.stderr)} "
            f"(set COLIBRI_REMOTE_CACHE to a writable directory on the board)"
        )
    if done.returncode != 0:
        raise ColibriError(f"looking at {remote} failed with status {done.returncode}: {_last_line(done.stderr)}")
    found = {"have": set(), "prefix": False, "free": None, "machine": "", "cache": cache}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "colibri-machine":
            found["machine"] = value.strip()
        elif key == "colibri-cache":
            found["cache"] = value.strip()
        elif key == "colibri-have":
            found["have"].add(value.strip())
        elif key == "colibri-prefix":
            found["prefix"] = True
        elif key == "colibri-space":
            # df -P: filesystem, 1024-blocks, used, available, capacity, mount point
            fields = value.split()
            if len(fields) >= 6 and fields[3].isdigit() and fields[4].endswith("%"):
                found["free"] = int(fields[3]) * 1024
    if not found["machine"]:
        raise ColibriError(f"{remote} did not say what machine it is (`uname -m` printed nothing)")
    return found


def check_machine(remote: Remote, board: Board, machine: str) -> None:
    if runs_on(board.isa, machine):
        return
    matching = [
        name
        for name in available_boards()
        if (other := load_board(name)).runner.takes_remote and runs_on(other.isa, machine)
    ]
    hint = f" (--board {' or '.join(matching)} matches it)" if matching else ""
    raise ColibriError(
        f"{remote} is an {machine} machine (uname -m) but board {board.name} is for {board.isa}: "
        f"nothing was copied{hint}"
    )


def copy_blob(remote: Remote, cache: str, blob: Blob, progress: Callable[[str], None] | None) -> int:
    """Stream one file into the board's cache; returns the bytes sent. The board keeps it only
    complete: a temporary name, its size and SHA-256 checked there, then a rename."""
    script = "; ".join(
        [
            f"d={shell_path(cache)}",
            f't="$d/.{blob.sha256}.partial.$$"',
            "trap 'rm -f \"$t\"' EXIT",
            "trap 'exit 1' HUP INT TERM PIPE",
            'cat > "$t" || exit 4',
            'n=$(($(wc -c < "$t")))',
            f'if [ "$n" -ne {blob.size} ]; then echo "received $n of {blob.size} bytes" >&2; exit 5; fi',
            'if command -v sha256sum >/dev/null 2>&1; then s=$(sha256sum < "$t"); '
            f'if [ "${{s%% *}}" != {blob.sha256} ]; then '
            'echo "the copy differs from the original (SHA-256)" >&2; exit 5; fi; fi',
            f'chmod {blob.mode} "$t" && mv -f "$t" "$d/{blob.sha256}"',
        ]
    )
    argv = remote.ssh_argv(script)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as e:
        raise ColibriError(f"cannot start {argv[0]}: {e.strerror}") from None
    sent, shown = 0, 0
    try:
        with open(blob.path, "rb") as f:
            while chunk := f.read(1 << 20):
                proc.stdin.write(chunk)
                sent += len(chunk)
                if progress and blob.size >= 16 << 20 and sent * 10 // blob.size > shown:
                    shown = sent * 10 // blob.size
                    progress(f"  {blob.label}: {10 * shown}% ({sent / 1e6:.0f} of {blob.size / 1e6:.0f} MB)")
    except BrokenPipeError:
        pass  # the board stopped reading: its status and stderr say why
    finally:
        # End of input: whatever was sent, the board checks it and keeps it only if complete.
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
        status = proc.wait()
        err = proc.stderr.read()
        proc.stderr.close()
    if status == 255:
        raise ColibriError(
            ssh_failure(
                remote,
                err.decode("utf-8", "replace"),
                f"while copying the {blob.label} (nothing incomplete is kept on the board)",
            )
        )
    if status != 0:
        raise ColibriError(
            f"copying the {blob.label} to {remote} failed: {_last_line(err)} (nothing incomplete is kept on the board)"
        )
    return sent


def deploy(
    remote: Remote,
    board: Board,
    program: Path,
    weights: Path,
    prefix: tuple[str, ...],
    progress: Callable[[str], None] | None = None,
) -> Deployment:
    """Make sure the board's cache holds the firmware and the weight image; returns where and what was sent."""
    cache = remote_cache()
    blobs = [
        Blob("firmware", "firmware", program, file_sha256(program), program.stat().st_size, "755"),
        Blob("weights", "weight image", weights, file_sha256(weights), weights.stat().st_size, "644"),
    ]
    seen = look(remote, cache, blobs, prefix)
    if prefix:
        # The prefix (an emulator in the tests) runs the program, whatever the board's own machine.
        if not seen["prefix"]:
            raise ColibriError(
                f"{remote} has no {prefix[0]} on its PATH, which the remote prefix "
                f"({shlex.join(prefix)}) needs: nothing was copied"
            )
    else:
        check_machine(remote, board, seen["machine"])
    missing = [b for b in blobs if b.sha256 not in seen["have"]]
    need = sum(b.size for b in missing)
    if missing and seen["free"] is not None and need > seen["free"]:
        raise ColibriError(
            f"not enough space on {remote}: {seen['cache']} has {seen['free']:,} bytes free, the "
            f"{' and the '.join(b.label for b in missing)} need {need:,}: nothing was copied (free "
            f"space there or set COLIBRI_REMOTE_CACHE to a directory with room)"
        )
    sent = {b.what: 0 for b in blobs}
    if missing and progress:
        progress(
            f"copying the {' and the '.join(b.label for b in missing)} ({need / 1e6:.1f} MB) to "
            f"{remote}:{seen['cache']}"
        )
    for blob in missing:
        sent[blob.what] = copy_blob(remote, cache, blob, progress)
    return Deployment(seen["cache"], seen["machine"], sent)


# ---- the run ------------------------------------------------------------------------------------


def explain_remote(remote: Remote) -> Callable[[int, str, int], str]:
    """Why a run over ssh ended before its done frame, from ssh's status: 255 is ssh's own failure,
    128 + N the firmware killed by signal N (sh reports it so), anything else the firmware's status."""

    def explain(status: int, stderr: str, tokens: int) -> str:
        if status == 255:
            return ssh_failure(remote, stderr, f"during the run ({tokens} tokens received)")
        if status > 128:
            sig = status - 128
            oom = (
                " — on Linux that is usually the kernel's out-of-memory killer (see `dmesg` on the board)"
                if sig == 9
                else ""
            )
            return (
                f"the firmware was killed on {remote} by signal {sig} ({signal_name(sig)}) after {tokens} tokens{oom}"
            )
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        detail = f": {lines[-1].strip()}" if lines else ""
        if status == 126:
            return (
                f"{remote} cannot execute the firmware{detail} (a cache directory on a noexec mount? set "
                f"COLIBRI_REMOTE_CACHE)"
            )
        if status == 127:
            return f"a program the run needs is missing on {remote}{detail}"
        if status == 3:
            return f"the cache directory on {remote} disappeared during the run{detail}"
        return f"the firmware exited on {remote} with status {status} before finishing{detail}"

    return explain


def ran_on(board: Board, result: RunResult) -> str:
    """The board a run ran on, for a line of text: with the SSH host and what was copied to it."""
    if not result.remote:
        return board.name
    sent = result.remote.bytes_sent
    copied = sent["firmware"] + sent["weights"]
    return f"{board.name} at {result.remote.host} ({f'{copied:,} bytes copied' if copied else 'nothing copied'})"


def remote_command(
    remote: Remote,
    board: Board,
    program: Path,
    weights: Path,
    options: list[str],
    progress: Callable[[str], None] | None = None,
) -> tuple[list[str], Deployment]:
    """Deploy (only what the board lacks); the ssh command that runs the firmware there with its
    command-line `options`, reading request frames from its stdin."""
    prefix = remote_prefix(board)
    deployment = deploy(remote, board, program, weights, prefix, progress)
    program_sha, weights_sha = file_sha256(program), file_sha256(weights)
    script = "; ".join(
        [
            f"cd {shlex.quote(deployment.cache)} || exit 3",
            # Not exec'd: sh then reports a firmware killed by a signal as 128 + N, where ssh would say 255.
            shlex.join([*prefix, f"./{program_sha}", "--weights", f"./{weights_sha}", *options]),
            "exit $?",
        ]
    )
    return remote.ssh_argv(script), deployment


def check_remote_machine(remote: Remote, board: Board, hello: dict[str, str]) -> None:
    machine = hello.get("machine")
    if machine is not None and not runs_on(board.isa, machine):
        raise ColibriError(f"the firmware for {board.isa} reports running on {machine} on {remote}")


def run_remote(
    remote: Remote,
    board: Board,
    program: Path,
    weights: Path,
    request: RunRequest,
    session: Session,
    timeout: float,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Deploy (only what the board lacks) and run the firmware there; RunResult.remote says where and
    how many bytes were sent."""
    argv, deployment = remote_command(remote, board, program, weights, request.firmware_options(), progress)
    prefix = remote_prefix(board)
    frame = request_frame(request)
    result = run_process(argv, frame, session, timeout, explain_remote(remote))
    hello = result.hello
    check_remote_machine(remote, board, hello)
    machine = hello.get("machine")
    sent = {**deployment.sent, "request": len(frame)}
    result.remote = RemoteRun(
        host=str(remote),
        cache=deployment.cache,
        machine=deployment.machine,
        prefix=list(prefix),
        firmware_machine=machine,
        cpu=hello.get("cpu"),
        kernels=hello.get("kernels"),
        bytes_sent={**sent, "total": sum(sent.values())},
    )
    return result
