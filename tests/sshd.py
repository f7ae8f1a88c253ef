"""A real OpenSSH server for the tests, run as a process of the test's own on a free localhost port:
its host key, authorized key, sshd_config and the client's ssh config, keys and known_hosts all live
in one temporary directory. Nothing of the system's configuration (nor ~/.ssh) is read or written."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
ALIAS = "colibri-board"  # the Host entry of the client config, as a user's ~/.ssh/config would have


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)


def descendants(pid: int) -> list[int]:
    """Every process below pid (sshd's session processes call setsid, but stay its children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for c in map(int, children):
            found.append(c)
            todo.append(c)
    return found


class Sshd:
    ATTEMPTS = 5  # a free port can be taken by another process before sshd binds it: try another

    def __init__(self, root: Path, extra_config: str = ""):
        self.root = root
        self.extra_config = extra_config
        root.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "id_ed25519", "wrong_key"):
            keygen(root / name)
        (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
        (root / "empty_known_hosts").write_text("")
        # sshd's privilege-separation directory (the Debian package creates it at boot only).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for attempt in range(self.ATTEMPTS):
            if self._start(free_port()):
                return
        raise RuntimeError(f"sshd did not start in {self.ATTEMPTS} attempts: {(root / 'sshd.log').read_text()}")

    def _start(self, port: int) -> bool:
        """sshd on this port, waited for until its log says it listens there; False if it exited
        (the port was taken meanwhile)."""
        root = self.root
        self.port = port
        host_pub = (root / "host_key.pub").read_text().split()
        (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        (root / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxStartups 50
LogLevel VERBOSE
{self.extra_config}
""")
        self.log = open(root / "sshd.log", "wb")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        listening = f"Server listening on 127.0.0.1 port {port}.".encode()
        deadline = time.monotonic() + 10
        while listening not in (root / "sshd.log").read_bytes():
            if self.proc.poll() is not None:
                self.log.close()
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()}")
            time.sleep(0.05)
        return True

    def client_config(
        self, name: str = "config", identity: str = "id_ed25519", known_hosts: str = "known_hosts"
    ) -> Path:
        """An ssh config with the board's alias, a key and known_hosts of this directory, no agent."""
        path = self.root / name
        path.write_text(f"""\
Host {ALIAS}
    HostName 127.0.0.1
    Port {self.port}
    User root
Host *
    IdentityFile {self.root}/{identity}
    IdentitiesOnly yes
    IdentityAgent none
    UserKnownHostsFile {self.root}/{known_hosts}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    PasswordAuthentication no
""")
        return path

    def hosts_config(self, addresses: tuple[str, ...]) -> Path:
        """An ssh config reaching this sshd at each loopback address (its extra_config's
        ListenAddress lines), its host key known there: several hosts, as mpirun and Ansible see them."""
        root = self.root
        kind, key = (root / "host_key.pub").read_text().split()[:2]
        (root / "known_hosts").write_text("".join(f"[{a}]:{self.port} {kind} {key}\n" for a in addresses))
        config = root / "hosts_config"
        config.write_text(
            f"Host *\n    Port {self.port}\n    User root\n    IdentityFile {root}/id_ed25519\n"
            f"    IdentitiesOnly yes\n    IdentityAgent none\n    UserKnownHostsFile {root}/known_hosts\n"
            "    GlobalKnownHostsFile /dev/null\n    StrictHostKeyChecking yes\n    PasswordAuthentication no\n"
        )
        return config

    def ssh_command(self, **config) -> str:
        """COLIBRI_SSH_COMMAND for a client config (see client_config)."""
        return shlex.join(["ssh", "-F", str(self.client_config(**config))])

    def stop(self) -> None:
        """Stop the server and every session it serves, as a board's sshd going away mid-run would."""
        if self.proc.poll() is None:
            sessions = [p for p in descendants(self.proc.pid) if _is_sshd(p)]
            self.proc.send_signal(signal.SIGKILL)
            for pid in sessions:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait()
        self.log.close()


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd")
    except OSError:
        return False


def processes_running(argv0: str) -> list[int]:
    """Processes whose argv[0] is argv0 (the firmware as the remote run starts it: ./<sha256>)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].decode("utf-8", "replace") == argv0:
                found.append(int(entry.name))
    return found
