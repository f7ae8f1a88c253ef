"""The setup installs what is missing: dpkg's status words are parsed, not matched by suffix."""

from __future__ import annotations

import itertools
import os
import stat
import sys

import pytest
from conftest import TESTS

from generator.device import setup_toolchain
from generator.device.setup_toolchain import USABLE_STATES, status_is_installed
from generator.errors import ColibriError

WANTS = ("unknown", "install", "hold", "deinstall", "purge")
FLAGS = ("ok", "reinstreq")
STATES = (
    "not-installed",
    "config-files",
    "half-installed",
    "unpacked",
    "half-configured",
    "triggers-awaited",
    "triggers-pending",
    "installed",
)


@pytest.mark.parametrize("want,flag,state", list(itertools.product(WANTS, FLAGS, STATES)))
def test_every_status_dpkg_can_print(want, flag, state):
    expected = flag == "ok" and state in ("installed", "triggers-awaited", "triggers-pending")
    assert status_is_installed(f"{want} {flag} {state}") is expected


def test_a_package_apt_knows_but_never_installed_is_not_installed():
    assert not status_is_installed("unknown ok not-installed")
    assert not status_is_installed("deinstall ok config-files")
    assert set(USABLE_STATES) == {"installed", "triggers-awaited", "triggers-pending"}


@pytest.mark.parametrize("text", ["", "installed", "install ok", "install ok installed extra", "garbage"])
def test_malformed_status_is_not_installed(text):
    assert not status_is_installed(text)


@pytest.fixture
def fake_dpkg(tmp_path, monkeypatch):
    """A dpkg-query on PATH that answers from a table, as the real one does (exit 1 when a name is unknown)."""

    def install(table: dict[str, str]):
        script = tmp_path / "dpkg-query"
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"table = {table!r}\n"
            "names = sys.argv[3:]\n"
            "for key, status in table.items():\n"
            "    if key.split(':')[0] in names:\n"
            "        print(f'{key}\\t{status}')\n"
            "sys.exit(0 if all(any(k.split(':')[0] == n for k in table) for n in names) else 1)\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    return install


def test_installed_packages_reads_every_line(fake_dpkg):
    fake_dpkg(
        {
            "gcc-multilib": "unknown ok not-installed",
            "libc6-dev:amd64": "install ok installed",
            "libc6-dev:i386": "deinstall ok config-files",
            "clang-14": "install reinstreq half-installed",
            "qemu-user": "hold ok installed",
        }
    )
    got = setup_toolchain.installed_packages(["gcc-multilib", "libc6-dev", "clang-14", "qemu-user", "nosuch"])
    assert got == {"libc6-dev", "qemu-user"}
    assert not setup_toolchain.installed("gcc-multilib")


def test_the_test_packages_not_installed_are_handed_to_apt(fake_dpkg, tmp_path, monkeypatch):
    fake_dpkg({"clang-14": "install ok installed", "gcc-multilib": "unknown ok not-installed"})
    listing = tmp_path / "apt-packages.txt"
    listing.write_text("clang-14  # fuzzer\ngcc-multilib # -m32\n\nlibclang-rt-14-dev\n")
    asked = []
    monkeypatch.setattr(setup_toolchain, "apt_install", lambda packages, why: asked.append(packages))
    setup_toolchain.ensure_packages(listing)
    assert asked == [["gcc-multilib", "libclang-rt-14-dev"]]


@pytest.mark.parametrize("name", ["-oAPT::Update::Pre-Invoke::=touch x", "gcc;id", "Gcc", "g"])
def test_a_listed_name_that_is_not_a_debian_package_never_reaches_apt(fake_dpkg, tmp_path, monkeypatch, name):
    fake_dpkg({})
    listing = tmp_path / "apt-packages.txt"
    listing.write_text(f"clang-14\n{name}\n")
    monkeypatch.setattr(setup_toolchain, "apt_install", lambda packages, why: pytest.fail("apt-get was run"))
    with pytest.raises(ColibriError, match="is not a Debian package name"):
        setup_toolchain.ensure_packages(listing)


def test_a_board_library_without_a_program_is_checked_too(fake_dpkg, monkeypatch):
    """qemu-rv32 needs picolibc, which puts no program on PATH: its package state decides."""
    from generator.boards import load_board

    board = load_board("qemu-rv32")
    fake_dpkg(
        {p: "install ok installed" for p in board.apt_packages if "picolibc" not in p}
        | {"picolibc-riscv64-unknown-elf": "unknown ok not-installed"}
    )
    monkeypatch.setattr(
        setup_toolchain.shutil,
        "which",
        lambda name: "/usr/bin/dpkg-query" if name == "dpkg-query" else f"/usr/bin/{name}",
    )
    packages, tools = setup_toolchain.missing_for(board)
    assert packages == ["picolibc-riscv64-unknown-elf"] and tools == []


def test_installing_never_removes_other_packages(monkeypatch):
    """apt-get would remove a cross compiler to install a package that conflicts with it (on a fresh
    Debian, libc6-dev-i386's recommended gcc-multilib did exactly that): only what is listed."""
    ran = []

    class Done:
        returncode, stderr = 0, ""

    monkeypatch.setattr(setup_toolchain.os, "geteuid", lambda: 0)
    monkeypatch.setattr(setup_toolchain.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(setup_toolchain.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or Done())
    setup_toolchain.apt_install(["gcc-12-multilib"], "test packages")
    install = [cmd for cmd in ran if "install" in cmd]
    assert install and all("--no-remove" in cmd and "--no-install-recommends" in cmd for cmd in install)


def test_the_test_packages_do_not_conflict_with_a_board_toolchain():
    """gcc-multilib conflicts with every Debian cross compiler; the suite names gcc-12-multilib."""
    from generator.boards import available_boards, load_board

    listed = {line.split("#")[0].strip() for line in (TESTS / "apt-packages.txt").read_text().splitlines()} - {""}
    board_packages = {p for name in available_boards() for p in load_board(name).apt_packages}
    assert "gcc-multilib" not in listed and "gcc-12-multilib" in listed
    assert any(p.startswith("gcc-aarch64") for p in board_packages)


def fake_apt(tmp_path, monkeypatch, locked_runs: int, final_error: str = ""):
    """An apt-get on PATH that fails with dpkg's lock message its first `locked_runs` times (as while
    unattended-upgrades runs at boot), then succeeds, or fails with `final_error`. Returns its log."""
    log = tmp_path / "apt.log"
    script = tmp_path / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'if [ "$(wc -l < {log})" -le {locked_runs} ]; then\n'
        "  echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 612 (unattended-upgr)' >&2\n"
        "  echo 'E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?' >&2\n"
        "  exit 100\n"
        "fi\n" + (f"echo '{final_error}' >&2; exit 100\n" if final_error else "exit 0\n")
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return log


def test_a_busy_dpkg_is_waited_for_and_said_once(tmp_path, monkeypatch, capsys):
    log = fake_apt(tmp_path, monkeypatch, locked_runs=2)
    setup_toolchain.run_apt(["apt-get", "install", "-y", "rauc"], dict(os.environ), wait=30, pause=0.01)
    runs = log.read_text().splitlines()
    assert len(runs) == 3 and all(r.startswith("-o DPkg::Lock::Timeout=") for r in runs)
    assert capsys.readouterr().err.count("another apt or dpkg holds its lock") == 1


def test_a_lock_held_past_the_wait_is_one_line_naming_it(tmp_path, monkeypatch):
    fake_apt(tmp_path, monkeypatch, locked_runs=10**6)
    with pytest.raises(ColibriError, match=r"^apt-get install failed: E: Unable to acquire the dpkg frontend lock"):
        setup_toolchain.run_apt(["apt-get", "install", "-y", "rauc"], dict(os.environ), wait=0.05, pause=0.01)


def test_other_apt_failures_are_not_retried(tmp_path, monkeypatch):
    log = fake_apt(tmp_path, monkeypatch, locked_runs=0, final_error="E: Unable to locate package nosuch")
    with pytest.raises(ColibriError, match="^apt-get install failed: E: Unable to locate package nosuch$"):
        setup_toolchain.run_apt(["apt-get", "install", "-y", "nosuch"], dict(os.environ), wait=30, pause=0.01)
    assert len(log.read_text().splitlines()) == 1


# ---- A board's sysroot, made once with mmdebstrap from the archive apt already uses ----


def apt_sources(root, one_line: str = "", deb822: str = ""):
    (root / "sources.list.d").mkdir(parents=True)
    (root / "sources.list").write_text(one_line)
    (root / "sources.list.d" / "debian.sources").write_text(deb822)
    return root


DEB822 = (
    "Types: deb-src\nURIs: http://src.example.org/debian\nSuites: bookworm\nComponents: main\n\n"
    "Types: deb\nURIs: http://off.example.org/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
    "Types: deb\n# a snapshot, commented out\nURIs: http://deb.example.org/debian/\n"
    "Suites: bookworm bookworm-updates\nComponents: main contrib\nSigned-By: /usr/share/keyrings/k.gpg\n"
)


def test_the_sysroots_mirror_is_the_one_apt_names_for_this_release(tmp_path):
    deb822 = apt_sources(tmp_path / "a", deb822=DEB822)
    assert setup_toolchain.debian_mirror("bookworm", deb822) == "http://deb.example.org/debian"
    one_line = apt_sources(
        tmp_path / "b",
        one_line="deb http://x.example.org/other trixie main\n"
        "deb [arch=amd64 signed-by=/k.gpg] https://y.example.org/debian bookworm main # comment\n",
    )
    assert setup_toolchain.debian_mirror("bookworm", one_line) == "https://y.example.org/debian"
    with pytest.raises(ColibriError, match=r"no Debian mirror for bullseye \(main\)"):
        setup_toolchain.debian_mirror("bullseye", deb822)
    hostile = apt_sources(tmp_path / "c", one_line="deb http://x.example.org/$(reboot) bookworm main\n")
    with pytest.raises(ColibriError, match="no Debian mirror"):
        setup_toolchain.debian_mirror("bookworm", hostile)


def fake_mmdebstrap(tmp_path, monkeypatch, fail: bool = False):
    """An mmdebstrap on PATH that logs its arguments and unpacks one file into its target (or fails)."""
    log = tmp_path / "mmdebstrap.log"
    script = tmp_path / "bin" / "mmdebstrap"
    script.parent.mkdir()
    body = (
        "echo 'E: cannot reach the mirror' >&2; exit 1\n"
        if fail
        else 'mkdir -p "$6/usr/lib"; touch "$6/usr/lib/libmpi.so"\n'
    )
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COLIBRI_SYSROOTS", str(tmp_path / "sysroots"))
    os_release = tmp_path / "os-release"
    os_release.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\n')
    return log, os_release


def test_a_sysroot_is_made_once_and_put_in_place_whole(tmp_path, monkeypatch, capsys):
    from generator.boards import load_board

    log, os_release = fake_mmdebstrap(tmp_path, monkeypatch)
    sysroot = load_board("linux-aarch64-mpi").sysroot
    apt = apt_sources(tmp_path / "apt", deb822=DEB822)
    made = setup_toolchain.make_sysroot(sysroot, apt, os_release)
    assert made == sysroot.path() and made.parent == tmp_path / "sysroots" and sysroot.is_made()
    assert (made / "usr/lib/libmpi.so").is_file() and [p.name for p in made.parent.iterdir()] == [made.name]
    assert log.read_text().split() == [
        "--quiet", "--arch=arm64", "--variant=extract", "--include=libopenmpi-dev,libc6-dev",
        "bookworm", log.read_text().split()[5], "http://deb.example.org/debian",
    ]  # fmt: skip
    assert "making the arm64 sysroot" in capsys.readouterr().err
    setup_toolchain.make_sysroot(sysroot, apt, os_release)
    assert len(log.read_text().splitlines()) == 1  # made once


def test_a_failed_sysroot_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from generator.boards import load_board

    _, os_release = fake_mmdebstrap(tmp_path, monkeypatch, fail=True)
    sysroot = load_board("linux-aarch64-mpi").sysroot
    with pytest.raises(ColibriError, match=r"could not make the arm64 sysroot: E: cannot reach the mirror"):
        setup_toolchain.make_sysroot(sysroot, apt_sources(tmp_path / "apt", deb822=DEB822), os_release)
    assert list((tmp_path / "sysroots").iterdir()) == [] and not sysroot.is_made()
