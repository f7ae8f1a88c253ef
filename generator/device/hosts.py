"""Where a firmware's MPI ranks run (boards whose runner runs ranks: boards/runners.py MpiRunner):
--hosts HOST[:SLOTS],... and --hostfile FILE, mpirun's own syntax, or --inventory FILE, an Ansible
inventory's hosts, checked before anything is built and handed to mpirun as its --host and
--hostfile; and what mpirun's stderr says when a rank dies or a host cannot be reached, as one line
naming the rank and the host.

mpirun reaches other hosts through SSH with the options --remote uses (device/remote.py), so a host
that does not answer is given up on within ConnectTimeout, and nothing asks for a password."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from ..boards import Board
from ..errors import ColibriError
from ..files import read_text_limited
from .process import signal_name
from .remote import SSH_OPTIONS, ssh_command

HOSTFILE_BYTES = 1 << 20
MAX_SLOTS = 1024
# A host name or an IPv4 address, as mpirun and ssh take it: never an option, nothing a shell reads.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
# A hostfile line: HOST, then slots=N and max_slots=N in any order (Open MPI's hostfile grammar).
_HOSTFILE_SETTING = re.compile(r"(slots|max_slots|max-slots)=([0-9]{1,4})")


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_SLOTS:
        raise ColibriError(f"{where}: slots must be a count from 1 to {MAX_SLOTS}, got {text!r}")
    return int(text)


def _host(name: str, where: str) -> str:
    if not _HOST.fullmatch(name):
        raise ColibriError(
            f"{where}: {name!r} is not a host name or IPv4 address (letters, digits, _ . -, not starting with -)"
        )
    return name


def parse_hosts(text: str) -> str:
    """--hosts: HOST[:SLOTS], comma-separated, each checked; mpirun's --host value."""
    entries = []
    for entry in text.split(","):
        name, _, slots = entry.partition(":")
        where = f"--hosts {text!r}"
        entries.append(f"{_host(name, where)}:{_slots(slots, where)}" if slots else _host(name, where))
    return ",".join(entries)


def check_hostfile(path: Path) -> Path:
    """--hostfile: every line a host and its settings in mpirun's grammar (# comments); the file's
    absolute path for mpirun."""
    text = read_text_limited(path, HOSTFILE_BYTES, f"hostfile {path}")
    hosts = 0
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"hostfile {path}, line {number}"
        _host(words[0], where)
        for word in words[1:]:
            found = _HOSTFILE_SETTING.fullmatch(word)
            if found is None:
                raise ColibriError(f"{where}: {word!r} is not slots=N or max_slots=N")
            _slots(found.group(2), where)
        hosts += 1
    if hosts == 0:
        raise ColibriError(f"hostfile {path} names no host")
    return path.resolve()


def inventory_hostvars(inventory: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    """Every host of an Ansible inventory and its variables, as `ansible-inventory --list` gives
    them (Ansible's own reading: INI, YAML, groups, ranges; what deploy ships to)."""
    if not inventory.is_file():
        raise ColibriError(f"--inventory {inventory}: no such file")
    tool = shutil.which("ansible-inventory")
    if tool is None:
        raise ColibriError(
            "ansible-inventory is not installed (Debian: apt-get install ansible-core; ./colibri test installs it)"
        )
    done = subprocess.run(
        [tool, "-i", str(inventory), "--list"], capture_output=True, env=env, timeout=INVENTORY_SECONDS
    )
    try:
        data = json.loads(done.stdout)
        hostvars = data.get("_meta", {}).get("hostvars", {})
    except (ValueError, AttributeError):
        said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:200]
        raise ColibriError(f"--inventory {inventory}: not an Ansible inventory ({said})") from None
    return {str(host): dict(variables or {}) for host, variables in hostvars.items()}


def rank_order(hostvars: dict[str, dict]) -> list[str]:
    """An inventory's hosts in the order that numbers the ranks: by name (rank r on the r-th, each
    taking its colibri_slots ranks), the order --inventory gives mpirun and deploy ships in."""
    return sorted(hostvars)


INVENTORY_SECONDS = 60
SSH_PORT = 22


def inventory_hosts(inventory: Path) -> str:
    """--inventory: its hosts as mpirun's --host value, by name (as deploy ships to them): each host's
    ansible_host (else its name) and colibri_slots ranks (default 1). A host mpirun's syntax cannot
    take is refused, as is a per-host port or user, which mpirun's one ssh command cannot carry."""
    hostvars = inventory_hostvars(inventory)
    if not hostvars:
        raise ColibriError(f"--inventory {inventory} names no host")
    entries = []
    for name in rank_order(hostvars):
        variables = hostvars[name]
        where = f"--inventory {inventory}, host {name}"
        address = _host(str(variables.get("ansible_host", name)), where)
        for key in ("ansible_port", "ansible_user"):
            if key in variables and not (key == "ansible_port" and str(variables[key]) == str(SSH_PORT)):
                raise ColibriError(
                    f"{where}: {key}={variables[key]} cannot reach mpirun, which starts every rank with the "
                    "same ssh: say it in an ssh config (Host/Port/User) and COLIBRI_SSH_COMMAND='ssh -F CONFIG'"
                )
        slots = _slots(str(variables.get("colibri_slots", 1)), f"{where}: colibri_slots")
        entries.append(f"{address}:{slots}")
    return ",".join(entries)


def hosts_for(board: Board, hosts: str | None, hostfile: Path | None, inventory: Path | None = None) -> tuple[str, ...]:
    """mpirun's arguments for where the ranks run (none: the runner's default, one rank here; a
    board that runs no ranks was refused them by option_checks), refused when more than one is given."""
    given = [a for a in (hosts, hostfile, inventory) if a is not None]
    if not given or not board.runner.runs_ranks:
        return ()
    if len(given) > 1:
        raise ColibriError("give the ranks' hosts with one of --hosts, --hostfile or --inventory")
    if hosts is not None:
        where = ["--host", parse_hosts(hosts)]
    elif hostfile is not None:
        where = ["--hostfile", str(check_hostfile(hostfile))]
    else:
        where = ["--host", inventory_hosts(Path(inventory))]
    # The SSH --remote uses: its command (COLIBRI_SSH_COMMAND: "ssh -F my_config") and options (batch
    # mode, never a prompt; a host that does not answer given up on in ConnectTimeout; keepalives
    # that notice a host gone mid-run).
    return (*where, "--mca", "plm_rsh_agent", rsh_agent(), "--mca", "plm_rsh_args", shlex.join(SSH_OPTIONS))


def rsh_agent() -> str:
    """The ssh command as mpirun's plm_rsh_agent, which it splits at spaces (not as a shell would)."""
    command = ssh_command()
    if any(not word or any(c.isspace() for c in word) for word in command):
        raise ColibriError(
            f"COLIBRI_SSH_COMMAND {shlex.join(command)!r}: mpirun splits its ssh command at spaces, so no "
            "word of it may hold one (a config file's path with a space: use a path without)"
        )
    return " ".join(command)


_RANK_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_RANK_STATUS = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)")
_RANK_ABORTED = re.compile(r"MPI_ABORT was invoked on rank (\d+)")
_DAEMONS_FAILED = "ORTE was unable to reliably start one or more daemons"


def explain_ranks(status: int, stderr: str, tokens: int) -> str:
    """The ranks' early end, from mpirun's stderr: which rank on which host died, or which host
    could not be reached; else mpirun's status and last line."""
    after = f" after {tokens} tokens"
    found = _RANK_SIGNALLED.search(stderr)
    if found:
        rank, node, number = found.group(1), found.group(2), int(found.group(3))
        return (
            f"rank {rank} on host {node} was killed by signal {number} ({signal_name(number)}){after}; "
            "mpirun ended the other ranks"
        )
    found = _RANK_STATUS.search(stderr)
    if found:
        return f"rank {found.group(1)} exited with status {found.group(2)}{after}; mpirun ended the other ranks"
    banner = stderr.find(_DAEMONS_FAILED)
    if banner >= 0:
        # What ssh said comes before mpirun's banner: the host refused, unknown, or not answering.
        said = [line.strip() for line in stderr[:banner].splitlines() if line.strip() and not line.startswith("---")]
        why = said[-1] if said else "mpirun could not start its daemon there"
        return f"a host of the ranks cannot be reached ({why}): no rank ran"
    found = _RANK_ABORTED.search(stderr)
    if found:
        return f"rank {found.group(1)} stopped every rank (MPI_Abort){after}"
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not line.startswith("-----")]
    detail = f": {lines[-1].strip()}" if lines else ""
    return f"the ranks' mpirun exited with status {status} before finishing{detail}"
