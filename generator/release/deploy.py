"""deploy and rollback on Linux boards: a release installed into a new slot on the board, its
self-test run there, and the board's `current` link switched only on PASS (board/colibri-slot, a
POSIX sh script that goes to the board with the release, so Ansible and Mender run the same file);
fleets through an Ansible playbook shipped here (ansible/deploy.yml), run by ansible-playbook.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..boards import load_board
from ..boards.runners import MpiRunner
from ..device.hosts import hosts_for, inventory_hostvars, rank_order
from ..device.links import explain_rank_end
from ..device.protocol import parse_frame
from ..device.remote import Remote, ssh_failure
from ..device.session import RunRequest, Selftest, request_frame
from ..errors import ColibriError
from .bundle import MANIFEST, rank_count, rank_image_file

HERE = Path(__file__).resolve().parent
SLOT_SCRIPT = HERE / "board" / "colibri-slot"
PLAYBOOK = HERE / "ansible" / "deploy.yml"
DEFAULT_ROOT = "/opt/colibri"  # on the board: slots/, current, previous
DEPLOY_SECONDS = 300
RECONNECT_SECONDS = 240  # after a dropped link: how long the board has to answer again and finish
RETRY_SECONDS = 3  # between attempts to reach it


@dataclass(frozen=True)
class Payload:
    """What goes to a board: the release's firmware and weight image, under a slot name."""

    name: str  # the release's name
    board: str
    program: Path
    weights: Path
    slot: str  # <release name>-<build id, 12 hex digits>: a new build is a new slot
    # A release for several MPI ranks: each rank's image (rank 0 first) and its slot's `rank` file
    # ("RANK RANKS IMAGE_SHA256 FIRMWARE_SHA256", what colibri-slot checks the rank's slot against).
    rank_weights: tuple[Path, ...] = ()
    rank_files: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return max(1, len(self.rank_weights))


def payload_of(bundle: Path) -> Payload:
    """The payload of a release bundle directory (./colibri release's output)."""
    bundle = Path(bundle)
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        board = load_board(manifest["board"]["name"])
        program, weights = bundle / manifest["firmware"]["file"], bundle / manifest["weights"]["file"]
        build = (manifest["firmware"].get("build_id") or manifest["model_hash"])[:12]
        name = manifest["name"]
        rank_weights, rank_files = rank_payload(bundle, manifest, name)
    except FileNotFoundError:
        raise ColibriError(
            f"{bundle} is not a release bundle (no {MANIFEST}): make one with ./colibri release"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ColibriError(f"{bundle / MANIFEST}: not a release manifest ({e})") from None
    if not board.runner.linux_program:  # host, linux-aarch64 and their MPI boards (host-mpi, ...)
        raise ColibriError(
            f"release {name} is for board {board.name}, which is not a Linux board: deploy is for host and linux-aarch64"
        )
    for path in (program, weights):
        if not path.is_file():
            raise ColibriError(f"release {name} lacks {path.relative_to(bundle)}")
    if manifest.get("verified") is False:
        raise ColibriError(f"release {name} did not match the reference when it was made: it is not deployed")
    return Payload(name, board.name, program, weights, f"{name}-{build}", rank_weights, rank_files)


def rank_payload(bundle: Path, manifest: dict, name: str) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """A release for several ranks: each rank's image and its slot's `rank` file (none otherwise)."""
    count = rank_count(manifest)
    if count == 1:
        return (), ()
    firmware_sha256 = manifest["outputs"][manifest["firmware"]["file"]]["sha256"]
    images, files = [], []
    for rank, entry in enumerate(manifest["ranks"]["images"]):
        image = bundle / rank_image_file(rank)
        if not image.is_file():
            raise ColibriError(f"release {name} lacks rank {rank}'s weight image {rank_image_file(rank)}")
        digest = str(entry.get("sha256", ""))
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not re.fullmatch(r"[0-9a-f]{64}", firmware_sha256):
            raise ColibriError(f"{bundle / MANIFEST}: rank {rank}'s image has no SHA-256")
        images.append(image)
        files.append(f"{rank} {count} {digest} {firmware_sha256}\n")
    return tuple(images), tuple(files)


class _Digesting:
    """A file read through once: what tarfile copies is also hashed, so a weight image is read once."""

    def __init__(self, f):
        self.f, self.sha256 = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha256.update(data)
        return data


def payload_tar(payload: Payload) -> bytes:
    """firmware, weights.img and their SHA256SUMS as one tar stream (what colibri-slot receive
    unpacks and checks before it installs anything)."""
    buf = io.BytesIO()
    sums = []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, name, mode in ((payload.program, "firmware", 0o755), (payload.weights, "weights.img", 0o644)):
            info = tar.gettarinfo(str(path), arcname=name)
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
            with open(path, "rb") as f:
                digesting = _Digesting(f)
                tar.addfile(info, digesting)
            sums.append(f"{digesting.sha256.hexdigest()}  {name}\n")
        text = "".join(sums).encode()
        info = tarfile.TarInfo("SHA256SUMS")
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


@dataclass(frozen=True)
class Deployed:
    """One board's outcome: PASS (current is the new slot), rolled back (the new slot failed its
    self-test and current is what it was), link dropped (the board was reached again after the
    link dropped: where it ended and its current slot's self-test), or unreachable."""

    host: str
    slot: str
    outcome: str  # "pass" | "rolled back" | "link dropped" | "unreachable" | "failed"
    selftest: Selftest | None
    current: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def line(self) -> str:
        if self.outcome == "link dropped":
            verdict = (
                "PASS" if self.selftest and self.selftest.passed else "FAIL" if self.selftest else "not self-tested"
            )
            on = f"board is on slot {self.current} ({verdict})" if self.current else "board has no current slot"
            test = f"; {self.selftest.line()}" if self.selftest else ""
            return f"{self.host}: LINK DROPPED deploying slot {self.slot}: {self.detail}; {on}{test}"
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
    # A rank's slot is checked, not self-tested (colibri-slot's rank_check): its line says how.
    checked = next((line.strip() for line in output.splitlines() if line.startswith("rank check ")), "")
    if status == 0:
        return Deployed(host, slot, "pass", selftest, current, checked)
    if status == 1 and "rolled back:" in output:
        return Deployed(host, slot, "rolled back", selftest, current, checked)
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
    return Deployed(host, slot, "failed", selftest, current, last.strip())


class LinkLost(ColibriError):
    """ssh ended with status 255 after it had connected: the link dropped, the board may go on."""


# ssh's 255s that mean it never got a session: the board cannot have started anything.
NEVER_CONNECTED = re.compile(
    r"REMOTE HOST IDENTIFICATION|Host key verification failed|host key is known|Permission denied|"
    r"Too many authentication failures|Could not resolve hostname|connect to host|Network is unreachable|"
    r"No route to host"
)


def _ssh(remote: Remote, script: str, stdin: bytes, doing: str, timeout: float = DEPLOY_SECONDS) -> tuple[int, str]:
    try:
        done = subprocess.run(remote.ssh_argv(script), input=stdin, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise ColibriError("ssh is not installed (Debian: apt-get install openssh-client)") from None
    except subprocess.TimeoutExpired:
        raise ColibriError(f"{remote}: no answer in {timeout:.0f} s while {doing}") from None
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if done.returncode == 255:
        failure = ssh_failure(remote, err, doing)
        raise ColibriError(failure) if NEVER_CONNECTED.search(err) else LinkLost(failure)
    return done.returncode, out + err


def _slot(
    remote: Remote, args: list[str], stdin: bytes, doing: str, timeout: float = DEPLOY_SECONDS
) -> tuple[int, str]:
    """colibri-slot ARGS on the board, the script itself sent along: the board needs nothing of Colibri."""
    script = f"exec sh -c {shlex.quote(SLOT_SCRIPT.read_text())} colibri-slot {shlex.join(args)}"
    return _ssh(remote, script, stdin, doing, timeout)


def _refusal(output: str) -> str:
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
    return last.strip().removeprefix("colibri-slot: error: ")


def deploy_remote(remote: Remote, payload: Payload, root: str = DEFAULT_ROOT) -> Deployed:
    """Install `payload` into a new slot under `root` on the board, run its self-test there and
    switch `current` only on PASS (one ssh session: the payload as a tar stream on its stdin). When
    the link drops, the board finishes on its own; this reconnects and says where it ended."""
    if payload.ranks > 1:
        raise ColibriError(
            f"release {payload.name} was made for {payload.ranks} MPI ranks, one board each: deploy it with "
            f"--inventory FILE naming {payload.ranks} hosts (rank r on the r-th by name), not --remote"
        )
    try:
        status, output = _slot(
            remote, ["receive", root, payload.slot], payload_tar(payload), f"deploying {payload.slot}"
        )
    except LinkLost as lost:
        return after_drop(remote, payload, root, str(lost))
    if status == 2:
        raise ColibriError(f"{remote}: deploy refused: {_refusal(output)}")
    return outcome_of(str(remote), payload.slot, status, output)


def _reach(remote: Remote, args: list[str], doing: str, deadline: float) -> tuple[int, str] | None:
    """colibri-slot ARGS, tried again while the board does not answer, until `deadline`."""
    while (left := deadline - time.monotonic()) > 0:
        try:
            return _slot(remote, args, b"", doing, timeout=left + 30)
        except ColibriError:
            time.sleep(min(RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
    return None


def status_fields(output: str) -> dict[str, str]:
    """colibri-slot status's words: current, previous, deploying, last (SLOT:RESULT)."""
    line = next((line for line in output.splitlines() if line.startswith("current=")), "")
    return dict(word.partition("=")[::2] for word in line.split())


def after_drop(remote: Remote, payload: Payload, root: str, why: str) -> Deployed:
    """The link dropped during a deploy: reconnect, wait (RECONNECT_SECONDS at most) for the board's
    deploy to finish, self-test its current slot and say what happened."""
    deadline = time.monotonic() + RECONNECT_SECONDS
    fields: dict[str, str] = {}
    while time.monotonic() < deadline and fields.get("deploying") != "no":
        wait = max(1, min(60, int(deadline - time.monotonic())))
        answer = _reach(remote, ["status", root, str(wait)], "asking the board how the deploy went", deadline)
        if answer is None:
            break
        fields = status_fields(answer[1])
    if not fields:
        return Deployed(
            str(remote),
            payload.slot,
            "unreachable",
            None,
            "",
            f"{why}; the board did not answer again in {RECONNECT_SECONDS} s: where its deploy ended is unknown",
        )
    tested = ""
    if fields.get("current") and fields.get("deploying") == "no":
        answer = _reach(remote, ["selftest", root], f"self-testing slot {fields['current']}", deadline + 60)
        tested = answer[1] if answer else ""
    return landed(str(remote), payload.slot, why, fields, tested)


def landed(host: str, slot: str, why: str, fields: dict[str, str], selftest_output: str) -> Deployed:
    """Where a board whose link dropped during the deploy of `slot` ended, from its colibri-slot
    status fields and its current slot's self-test output."""
    current = fields.get("current", "")
    if fields.get("deploying") != "no":
        return Deployed(
            host, slot, "link dropped", None, current, f"{why}; the board is still deploying (colibri-slot status)"
        )
    last_slot, _, result = fields.get("last", "").partition(":")
    happened = {
        "pass": "the deploy finished on the board",
        "current": f"slot {slot} was current already",
        "rolled-back": f"slot {slot} failed its self-test on the board and was removed",
    }.get(result if last_slot == slot else "", "the release did not arrive whole: nothing was installed")
    return Deployed(
        host, slot, "link dropped", selftest_of(selftest_output), current, f"{why}; reconnected: {happened}"
    )


def rollback_remote(remote: Remote, root: str = DEFAULT_ROOT) -> str:
    """Point the board's current back at the slot it replaced, once that slot passes its self-test;
    returns that slot."""
    status, output = _slot(remote, ["rollback", root], b"", "rolling back")
    if status != 0:
        raise ColibriError(f"{remote}: rollback failed: {_refusal(output)}")
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
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING=os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"))
    ssh = os.environ.get("COLIBRI_SSH_COMMAND", "").strip()
    if ssh:
        # The same ssh the other commands use (an -F config, options): its arguments for Ansible.
        env["ANSIBLE_SSH_ARGS"] = shlex.join([*shlex.split(ssh)[1:], "-o", "BatchMode=yes"])
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.setdefault("ANSIBLE_PIPELINING", "True")  # one ssh session per task, not three
    ranks = rank_hosts(inventory, payload, env, root) if payload.ranks > 1 else None
    with tempfile.TemporaryDirectory(prefix="colibri-deploy-") as tmp:
        results = Path(tmp) / "results"
        results.mkdir()
        extra = {
            "colibri_firmware": str(payload.program),
            "colibri_weights": str(payload.weights),
            "colibri_slot": payload.slot,
            "colibri_results": str(results),
            **({} if root is None else {"colibri_root": root}),
            **(
                {
                    "colibri_rank_weights": {h: str(payload.rank_weights[r]) for r, h in enumerate(ranks.hosts)},
                    "colibri_rank_file": {h: payload.rank_files[r] for r, h in enumerate(ranks.hosts)},
                    "colibri_stage_only": True,  # switched below, after the ranks' joint self-test
                }
                if ranks
                else {}
            ),
        }
        done = subprocess.run(
            [playbook, "-i", str(inventory), str(PLAYBOOK), "-e", json.dumps(extra)],
            capture_output=True,
            env=env,
            timeout=DEPLOY_SECONDS * 2,
        )
        hosts = list(ranks.hosts) if ranks else hosts_of(inventory, env)  # (ranks: listed above, in rank order)
        outcomes = []
        for host in hosts:
            found = results / f"{host}.json"
            if found.is_file():
                r = json.loads(found.read_text())
                if "dropped" in r:
                    why = f"the link dropped during the deploy ({(r['dropped'].strip().splitlines() or ['no message'])[0][:160]})"
                    outcomes.append(landed(host, payload.slot, why, status_fields(r["status"]), r["selftest"]))
                else:
                    outcomes.append(outcome_of(host, payload.slot, int(r["rc"]), r["stdout"] + "\n" + r["stderr"]))
            else:
                outcomes.append(
                    Deployed(host, payload.slot, "unreachable", None, "", unreachable_reason(done.stdout, host))
                )
    if not hosts:
        raise ColibriError(f"--inventory {inventory}: no hosts (ansible-playbook said: {done.stdout.decode()[-200:]})")
    return switch_together(ranks, payload, outcomes) if ranks else outcomes


@dataclass(frozen=True)
class RankHosts:
    """A release for several ranks: the inventory's hosts in rank order (rank r on the r-th), each
    host's address and slots' directory, and mpirun's arguments that start a rank on each."""

    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    roots: tuple[str, ...]
    mpirun_hosts: tuple[str, ...]


def rank_hosts(inventory: Path, payload: Payload, env: dict[str, str], root: str | None) -> RankHosts:
    """The ranks' hosts, in the order that gives ranks on run (--inventory: by name, rank r on the
    r-th), refused in one line before anything is copied unless there is one host per rank and
    mpirun can start a rank on each (its own host syntax, one ssh for all: device/hosts.py)."""
    hostvars = inventory_hostvars(inventory, env)
    hosts = rank_order(hostvars)
    for host in hosts:
        if str(hostvars[host].get("colibri_slots", 1)) != "1":
            raise ColibriError(
                f"--inventory {inventory}, host {host}: colibri_slots={hostvars[host]['colibri_slots']}: deploy "
                f"ships one rank's image to each host; give release {payload.name} one host per rank"
            )
    if len(hosts) != payload.ranks:
        raise ColibriError(
            f"--inventory {inventory} names {len(hosts)} host{'s' if len(hosts) != 1 else ''} and release "
            f"{payload.name} was made for {payload.ranks} ranks: give one host per rank (rank r on the r-th by "
            "name), or release for as many ranks as there are hosts (--ranks N); nothing was copied"
        )
    mpirun_hosts = hosts_for(load_board(payload.board), None, None, inventory)
    roots = tuple(
        slots_root(root or str(hostvars[h].get("colibri_root", DEFAULT_ROOT)), f"--inventory {inventory}, host {h}")
        for h in hosts
    )
    addresses = tuple(str(hostvars[h].get("ansible_host", h)) for h in hosts)  # checked by hosts_for
    return RankHosts(tuple(hosts), addresses, roots, mpirun_hosts)


def slots_root(root: str, where: str) -> str:
    """A host's slots' directory, as it reaches mpirun's command line and the host's shell: an
    absolute path of plain characters."""
    if not re.fullmatch(r"/[A-Za-z0-9._+/-]*", root) or ".." in root.split("/"):
        raise ColibriError(
            f"{where}: colibri_root {root[:80]!r} is not an absolute path of letters, digits and ._+-/: "
            "give the slots' directory as such a path"
        )
    return root


JOINT_SELFTEST_SECONDS = 120


def joint_selftest(ranks: RankHosts, payload: Payload) -> tuple[Selftest | None, str]:
    """The self-test of every host's new slot at once: one mpirun over the hosts (rank r on the r-th,
    the ssh --hosts uses), each rank started from its own host's slot. (the selftest frame, why it
    failed: empty on PASS)."""
    runner = load_board(payload.board).runner
    assert isinstance(runner, MpiRunner)
    contexts = [
        ["-np", "1", f"{root}/slots/{payload.slot}/firmware", "--weights", f"{root}/slots/{payload.slot}/weights.img"]
        for root in ranks.roots
    ]
    argv = [*runner.launcher_prefix(ranks.mpirun_hosts), *[a for c in contexts for a in [*c, ":"]][:-1]]
    try:
        done = subprocess.run(
            argv,
            input=request_frame(RunRequest([], 0, selftest=True)),
            capture_output=True,
            timeout=JOINT_SELFTEST_SECONDS,
        )
    except FileNotFoundError:
        raise ColibriError(f"{argv[0]} is not installed (Debian: apt-get install openmpi-bin)") from None
    except subprocess.TimeoutExpired:  # subprocess.run killed mpirun, which ends its ranks
        return None, f"no selftest frame from the ranks in {JOINT_SELFTEST_SECONDS} s"
    selftest = selftest_of(done.stdout.decode(errors="replace"))
    if done.returncode == 0 and selftest is not None and selftest.passed:
        return selftest, ""
    if selftest is not None and not selftest.passed:
        return selftest, selftest.line()
    return selftest, explain_rank_end(done.returncode, done.stderr.decode(errors="replace"), 0)


def switch_together(ranks: RankHosts, payload: Payload, staged: list[Deployed]) -> list[Deployed]:
    """After every host's new slot is installed and checked (staged): the ranks' joint self-test,
    then every host switched on its PASS; on its FAIL, or when a host's slot did not stage, the
    staged slots removed and no host switched (each host's line says which rank and host failed)."""
    failed = next((o for o in staged if not o.passed), None)
    selftest = None
    if failed is not None:
        rank = ranks.hosts.index(failed.host)
        why = f"rank {rank}'s host {failed.host} did not take its slot ({failed.outcome}: {failed.detail})"
    else:
        selftest, said = joint_selftest(ranks, payload)
        found = re.match(r"rank (\d+)\b", said)
        on = f" (rank {found.group(1)} is host {ranks.hosts[int(found.group(1))]})" if found else ""
        why = f"the ranks' joint self-test over {len(ranks.hosts)} hosts failed: {said}{on}" if said else ""
    outcomes = []
    for host, address, root, before in zip(ranks.hosts, ranks.addresses, ranks.roots, staged):
        if before.outcome in ("unreachable", "link dropped"):
            outcomes.append(before)
            continue
        command = "discard" if why else "switch"
        try:
            status, output = _slot(Remote(address), [command, root, payload.slot], b"", f"{command}ing {payload.slot}")
        except ColibriError as e:
            outcomes.append(Deployed(host, payload.slot, "failed", selftest, before.current, f"{command}: {e}"))
            continue
        current = current_of(output)
        if status != 0:
            outcomes.append(Deployed(host, payload.slot, "failed", selftest, current, f"{command}: {_refusal(output)}"))
        elif why:
            outcomes.append(
                Deployed(host, payload.slot, "rolled back", before.selftest, current, f"{why}; no host switched")
            )
        else:
            joint = f"the ranks' joint self-test PASS over {len(ranks.hosts)} hosts"
            outcomes.append(Deployed(host, payload.slot, "pass", selftest, current, f"{before.detail}; {joint}"))
    return outcomes


def hosts_of(inventory: Path, env: dict[str, str]) -> list[str]:
    """The inventory's hosts, as ansible-inventory lists them."""
    return rank_order(inventory_hostvars(inventory, env))


def unreachable_reason(stdout: bytes, host: str) -> str:
    for line in stdout.decode(errors="replace").splitlines():
        if host in line and ("UNREACHABLE" in line or "FAILED" in line):
            return line.strip()[:200]
    return "no result from the host"
