"""deploy and rollback on Linux boards: a release installed into a new slot on the board, its
self-test run there, and the board's `current` link switched only on PASS (board/colibri-slot, a
POSIX sh script that goes to the board with the release, so Ansible and Mender run the same file);
fleets through an Ansible playbook shipped here (ansible/deploy.yml), run by ansible-playbook.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..boards import load_board
from ..device.protocol import parse_frame
from ..device.remote import Remote, ssh_failure
from ..device.session import Selftest
from ..errors import ColibriError
from .bundle import MANIFEST

HERE = Path(__file__).resolve().parent
SLOT_SCRIPT = HERE / "board" / "colibri-slot"
PLAYBOOK = HERE / "ansible" / "deploy.yml"
DEFAULT_ROOT = "/opt/colibri"  # on the board: slots/, current, previous
DEPLOY_SECONDS = 300


@dataclass(frozen=True)
class Payload:
    """What goes to a board: the release's firmware and weight image, under a slot name."""

    name: str  # the release's name
    board: str
    program: Path
    weights: Path
    slot: str  # <release name>-<build id, 12 hex digits>: a new build is a new slot


def payload_of(bundle: Path) -> Payload:
    """The payload of a release bundle directory (./colibri release's output)."""
    bundle = Path(bundle)
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        board = load_board(manifest["board"]["name"])
        program, weights = bundle / manifest["firmware"]["file"], bundle / manifest["weights"]["file"]
        build = (manifest["firmware"].get("build_id") or manifest["model_hash"])[:12]
        name = manifest["name"]
    except FileNotFoundError:
        raise ColibriError(
            f"{bundle} is not a release bundle (no {MANIFEST}): make one with ./colibri release"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ColibriError(f"{bundle / MANIFEST}: not a release manifest ({e})") from None
    if not board.runner.takes_remote:
        raise ColibriError(
            f"release {name} is for board {board.name}, which is not a Linux board: deploy is for host and linux-aarch64"
        )
    for path in (program, weights):
        if not path.is_file():
            raise ColibriError(f"release {name} lacks {path.relative_to(bundle)}")
    if manifest.get("verified") is False:
        raise ColibriError(f"release {name} did not match the reference when it was made: it is not deployed")
    return Payload(name, board.name, program, weights, f"{name}-{build}")


def payload_tar(payload: Payload) -> bytes:
    """firmware, weights.img and colibri-slot as one tar stream (what the board unpacks)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, name, mode in (
            (payload.program, "firmware", 0o755),
            (payload.weights, "weights.img", 0o644),
            (SLOT_SCRIPT, "colibri-slot", 0o755),
        ):
            info = tar.gettarinfo(str(path), arcname=name)
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


@dataclass(frozen=True)
class Deployed:
    """One board's outcome: PASS (current is the new slot), rolled back (the new slot failed its
    self-test and current is what it was), or unreachable."""

    host: str
    slot: str
    outcome: str  # "pass" | "rolled back" | "unreachable" | "failed"
    selftest: Selftest | None
    current: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def line(self) -> str:
        what = {"pass": "PASS", "rolled back": "ROLLED BACK", "unreachable": "UNREACHABLE", "failed": "FAILED"}[
            self.outcome
        ]
        test = f"; {self.selftest.line()}" if self.selftest else ""
        cur = f", current {self.current}" if self.current else ""
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.host}: {what}: slot {self.slot}{cur}{test}{extra}"

    def to_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "slot": self.slot,
            "outcome": self.outcome,
            "current": self.current,
            "selftest": {"pass": self.selftest.passed, **self.selftest.fields} if self.selftest else None,
            "detail": self.detail,
        }


def selftest_of(output: str) -> Selftest | None:
    for line in output.splitlines():
        frame = parse_frame(line.encode())
        if frame is not None and frame.kind == "selftest":
            return Selftest(frame.fields.get("result") == "pass", frame.fields)
    return None


def current_of(output: str) -> str:
    for line in reversed(output.splitlines()):
        for word in line.split():
            if word.startswith("current="):
                return word.removeprefix("current=").rstrip(";")
    return ""


def outcome_of(host: str, slot: str, status: int, output: str) -> Deployed:
    """What colibri-slot's output and exit status say happened on `host`."""
    selftest = selftest_of(output)
    current = current_of(output)
    if status == 0:
        return Deployed(host, slot, "pass", selftest, current)
    if status == 1 and "rolled back:" in output:
        return Deployed(host, slot, "rolled back", selftest, current)
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
    return Deployed(host, slot, "failed", selftest, current, last.strip())


def _ssh(remote: Remote, script: str, stdin: bytes, doing: str) -> tuple[int, str]:
    try:
        done = subprocess.run(remote.ssh_argv(script), input=stdin, capture_output=True, timeout=DEPLOY_SECONDS)
    except FileNotFoundError:
        raise ColibriError("ssh is not installed (Debian: apt-get install openssh-client)") from None
    except subprocess.TimeoutExpired:
        raise ColibriError(f"{remote}: no answer in {DEPLOY_SECONDS} s while {doing}") from None
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if done.returncode == 255:
        raise ColibriError(ssh_failure(remote, err, doing))
    return done.returncode, out + err


def deploy_remote(remote: Remote, payload: Payload, root: str = DEFAULT_ROOT) -> Deployed:
    """Install `payload` into a new slot under `root` on the board, run its self-test there and
    switch `current` only on PASS (one ssh session: the payload as a tar stream on its stdin)."""
    incoming = f"{root}/incoming/{payload.slot}"
    q = shlex.quote
    script = (
        f"set -e; rm -rf {q(incoming)}; mkdir -p {q(incoming)}; tar -x -C {q(incoming)} -f -; set +e; "
        f"sh {q(incoming)}/colibri-slot deploy {q(root)} {q(payload.slot)} {q(incoming)}; status=$?; "
        f"rm -rf {q(incoming)}; exit $status"
    )
    status, output = _ssh(remote, script, payload_tar(payload), f"deploying {payload.slot}")
    return outcome_of(str(remote), payload.slot, status, output)


def rollback_remote(remote: Remote, root: str = DEFAULT_ROOT) -> str:
    """Point the board's current back at the slot it replaced; returns that slot."""
    q = shlex.quote
    # colibri-slot goes along on stdin: the board needs nothing of Colibri installed.
    script = f'tmp=$(mktemp); cat > "$tmp"; sh "$tmp" rollback {q(root)}; status=$?; rm -f "$tmp"; exit $status'
    status, output = _ssh(remote, script, SLOT_SCRIPT.read_bytes(), "rolling back")
    if status != 0:
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
        raise ColibriError(f"{remote}: rollback failed: {last.strip().removeprefix('colibri-slot: error: ')}")
    return current_of(output)


# ---- fleets: ansible-playbook ------------------------------------------------------------------


def ansible_playbook() -> str:
    found = shutil.which("ansible-playbook")
    if found is None:
        raise ColibriError(
            "ansible-playbook is not installed (Debian: apt-get install ansible-core; ./colibri test installs it)"
        )
    return found


def deploy_inventory(inventory: Path, payload: Payload, root: str | None = None) -> list[Deployed]:
    """Run the shipped playbook on every host of an Ansible inventory; one outcome per host. root:
    the slots' directory on every host (None: each host's colibri_root, else /opt/colibri)."""
    inventory = Path(inventory)
    if not inventory.is_file():
        raise ColibriError(f"--inventory {inventory}: no such file")
    playbook = ansible_playbook()
    with tempfile.TemporaryDirectory(prefix="colibri-deploy-") as tmp:
        results = Path(tmp) / "results"
        results.mkdir()
        extra = {
            "colibri_firmware": str(payload.program),
            "colibri_weights": str(payload.weights),
            "colibri_slot": payload.slot,
            "colibri_results": str(results),
            **({} if root is None else {"colibri_root": root}),
        }
        env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING=os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"))
        ssh = os.environ.get("COLIBRI_SSH_COMMAND", "").strip()
        if ssh:
            # The same ssh the other commands use (an -F config, options): its arguments for Ansible.
            env["ANSIBLE_SSH_ARGS"] = shlex.join([*shlex.split(ssh)[1:], "-o", "BatchMode=yes"])
        env.setdefault("ANSIBLE_NOCOLOR", "1")
        env.setdefault("ANSIBLE_PIPELINING", "True")  # one ssh session per task, not three
        done = subprocess.run(
            [playbook, "-i", str(inventory), str(PLAYBOOK), "-e", json.dumps(extra)],
            capture_output=True,
            env=env,
            timeout=DEPLOY_SECONDS * 2,
        )
        hosts = hosts_of(inventory, env)
        outcomes = []
        for host in hosts:
            found = results / f"{host}.json"
            if found.is_file():
                r = json.loads(found.read_text())
                outcomes.append(outcome_of(host, payload.slot, int(r["rc"]), r["stdout"] + "\n" + r["stderr"]))
            else:
                outcomes.append(
                    Deployed(host, payload.slot, "unreachable", None, "", unreachable_reason(done.stdout, host))
                )
    if not hosts:
        raise ColibriError(f"--inventory {inventory}: no hosts (ansible-playbook said: {done.stdout.decode()[-200:]})")
    return outcomes


def hosts_of(inventory: Path, env: dict[str, str]) -> list[str]:
    """The inventory's hosts, as ansible-inventory lists them."""
    tool = shutil.which("ansible-inventory") or "ansible-inventory"
    done = subprocess.run([tool, "-i", str(inventory), "--list"], capture_output=True, env=env, timeout=60)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        raise ColibriError(
            f"--inventory {inventory}: not an Ansible inventory ({done.stderr.decode()[-200:].strip()})"
        ) from None
    return sorted(data.get("_meta", {}).get("hostvars", {}))


def unreachable_reason(stdout: bytes, host: str) -> str:
    for line in stdout.decode(errors="replace").splitlines():
        if host in line and ("UNREACHABLE" in line or "FAILED" in line):
            return line.strip()[:200]
    return "no result from the host"
