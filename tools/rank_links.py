"""Bytes on the wire and decode speed of 2 or 4 MPI ranks over a simulated link, against the same
ranks over loopback (docs/several-boards.md, "Simulated links and the cost model").

    sudo .venv/bin/python tools/rank_links.py [--model DIR] [--ctx 256] [--ranks 2,4] [--steps 8,72]
        [--rate 1gbit] [--delay 0.2ms] [--link auto|netem|bridge|relay] [--rounds 3] [--out DIR]

Needs root (it creates network namespaces) and this machine's Open MPI (host-mpi's toolchain). It
builds the host-mpi firmware once per rank count (--out), then, for each rank count N:

- creates N network namespaces of its own, rank i's at 10.77.0.(i+1), joined by one of:
  - `netem` (a kernel with sch_netem): a bridge in a namespace of the tool's own, each rank's
    namespace a veth to it; the rank's end shaped by `tc qdisc ... netem rate RATE delay DELAY`,
    the bridge's end by `netem rate RATE` (the delay once each way, the rate on both ends);
  - `bridge` (no netem, --delay 0): the same bridge, each end shaped by `tbf rate RATE` (the rate,
    no added delay);
  - `relay` (no netem, a delay): a TAP device in each namespace, every TAP held by one relay process
    (tools/delay_line.c, compiled with gcc into a temporary folder) that forwards each frame to the
    TAP its destination MAC was learnt on (to every other when unknown or broadcast) DELAY after it
    was sent, each TAP's link holding RATE both ways: a userspace netem;
  the output says which, and the ping round trip between two ranks' namespaces (twice the delay
  plus the link's own overhead);
- runs `./colibri run --board host-mpi --json` in the first namespace with one rank per namespace
  (`--hosts 10.77.0.1:1,10.77.0.2:1,...`): mpirun's "ssh" (COLIBRI_SSH_COMMAND) is a script that
  runs the daemon's command in the namespace of the address it is given (with a hostname of its
  own) instead of logging in; Open MPI is held to its TCP transport on the link
  (OMPI_MCA_btl=tcp,self), so every byte the ranks exchange crosses it;
- runs the same N ranks with `--hosts localhost:N` in the first namespace, TCP over its own
  loopback, nothing else on it; and one rank alone;
- counts the bytes every rank's namespace sends (`ip -s link`) around each run, for two step
  counts: bytes per decoded token = the difference of bytes / the difference of tokens (the start,
  the prompt and the end cancel out), and takes decode tok/s from the runs' stats (best of
  --rounds; the rounds of the three ways alternate, so a change in the machine's load falls on all
  of them). Each row says the load average (uptime's first figure) over its runs.

Everything it creates (namespaces, the bridge, veths, TAPs, qdiscs, the relay and its build, the
script) is removed at the end, also on failure or Ctrl-C. Nothing but its own namespaces is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUBNET = "10.77.0"

# mpirun's ssh: skip ssh's options (mpirun passes the --remote options: -o NAME=VALUE ...), then
# run the daemon's command line in the namespace of the address it was given, under a hostname of
# its own (another board), as ssh's remote shell would.
AGENT = """#!/bin/sh
while [ "$#" -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done
case "$1" in
{cases}
*) echo "netns-ssh: no namespace has address $1" >&2; exit 255;;
esac
shift
exec ip netns exec "$namespace" unshare --uts sh -c 'hostname "$1"; exec sh -c "$0"' "$*" "$namespace"
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def bits_per_second(rate: str) -> float:
    """tc's rate syntax: 1gbit, 100mbit, 64kbit, 1000bit (bits per second)."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: give it as tc does, e.g. 1gbit or 100mbit")
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


def nanoseconds(delay: str) -> int:
    """tc's time syntax: 0.2ms, 200us, 1s, or 0."""
    m = re.fullmatch(r"([0-9.]+)\s*(s|ms|us|ns|)", delay.strip().lower())
    if not m:
        raise ValueError(f"delay {delay!r}: give it as tc does, e.g. 0.2ms or 200us")
    return round(float(m[1]) * {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1, "": 1e6}[m[2]])


@dataclass
class Links:
    namespaces: list[str]  # rank i's, at addresses[i]
    addresses: list[str]
    devices: list[str]  # each rank namespace's device on the link
    shaped: str  # how the link is made and shaped, as said in the output
    own: list[str] = field(default_factory=list)  # the tool's other namespaces (the bridge's)
    relay: subprocess.Popen | None = None


def interface_bytes(namespace: str, device: str) -> tuple[int, int]:
    """(tx, rx) bytes of a device in a namespace."""
    stats = json.loads(sh("ip", "-n", namespace, "-j", "-s", "link", "show", "dev", device))[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


def kernel_has_netem(namespace: str) -> bool:
    """Whether a netem qdisc can be made (on the namespace's loopback, removed at once)."""
    added = subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True)  # fmt: skip
    subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return added.returncode == 0


def shape(namespace: str, device: str, how: str, rate: str, delay: str) -> None:
    """Egress of a device: netem's rate and delay, or a token bucket of a few packets (a larger one
    let a whole token's messages through at the veth's own speed: 100 Mb/s ran as fast as 1 Gb/s)."""
    if how == "netem":
        extra = ("delay", delay) if nanoseconds(delay) else ()
        sh("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "netem", "rate", rate, *extra)
    else:
        sh("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", rate, "burst", "4kb",
           "latency", "50ms")  # fmt: skip


def build_relay(folder: Path) -> Path:
    program = folder / "delay_line"
    sh("gcc", "-O2", "-std=gnu11", "-Wall", "-o", str(program), str(REPO / "tools" / "delay_line.c"))
    return program


@contextmanager
def simulated_links(ranks: int, rate: str, delay: str, kind: str = "auto"):
    """N namespaces joined as `kind` says (auto: netem if the kernel has it, else the bridge with
    tbf when there is no delay, else the relay); everything removed on the way out."""
    tag = f"{os.getpid() % 100000}"
    hub = f"colibri-links-{tag}-hub"
    namespaces = [f"colibri-links-{tag}-r{i}" for i in range(ranks)]
    addresses = [f"{SUBNET}.{i + 1}" for i in range(ranks)]
    made: list[str] = []
    with ExitStack() as cleanup:

        def remove_namespaces():
            for namespace in made:  # veths, TAPs and the bridge go with their namespaces
                subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

        cleanup.callback(remove_namespaces)
        for namespace in (hub, *namespaces):
            sh("ip", "netns", "add", namespace)
            made.append(namespace)
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
        if kind == "auto":
            kind = "netem" if kernel_has_netem(hub) else "relay" if nanoseconds(delay) else "bridge"
        if kind == "relay":
            devices = ["tap0"] * ranks
            for namespace, address in zip(namespaces, addresses):
                sh("ip", "-n", namespace, "tuntap", "add", "dev", "tap0", "mode", "tap")
                sh("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "tap0")
                sh("ip", "-n", namespace, "link", "set", "tap0", "up")
            folder = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="colibri-links-")))
            relay = subprocess.Popen(
                [str(build_relay(folder)), str(nanoseconds(delay)), str(int(bits_per_second(rate))),
                 *(f"/run/netns/{namespace}:tap0" for namespace in namespaces)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            cleanup.callback(stop_relay, relay)  # before the namespaces go (the last in, the first out)
            if relay.stdout.readline().strip() != "ready":
                raise RuntimeError(f"rank_links: the relay did not start: {relay.stderr.read()}")
            shaped = f"TAP + userspace relay: rate {rate}, delay {delay} (this kernel has no sch_netem)"
            yield Links(namespaces, addresses, devices, shaped, [hub], relay)
            return
        devices = ["link0"] * ranks
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "up")
        for i, (namespace, address) in enumerate(zip(namespaces, addresses)):
            port = f"port{i}"
            sh("ip", "link", "add", "link0", "netns", namespace, "type", "veth", "peer", "name", port, "netns", hub)
            sh("ip", "-n", hub, "link", "set", port, "master", "br0")
            sh("ip", "-n", hub, "link", "set", port, "up")
            sh("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "link0")
            sh("ip", "-n", namespace, "link", "set", "link0", "up")
            shape(namespace, "link0", kind, rate, delay)  # the delay once each way: on the rank's end
            shape(hub, port, kind, rate, "0")
        if kind == "netem":
            shaped = f"bridge, netem rate {rate} delay {delay} each way"
        else:
            shaped = f"bridge, tbf rate {rate}, no added delay"
        yield Links(namespaces, addresses, devices, shaped, [hub])


def stop_relay(relay: subprocess.Popen) -> None:
    relay.terminate()
    try:
        relay.wait(timeout=5)
    except subprocess.TimeoutExpired:
        relay.kill()
        relay.wait()


def load() -> float:
    """The load average over the last minute (uptime's first figure)."""
    return os.getloadavg()[0]


def ping_rtt(links: Links, count: int = 50) -> tuple[float, float]:
    """(min, median) round trip in ms from rank 0's namespace to rank 1's."""
    times = subprocess.run(
        ["ip", "netns", "exec", links.namespaces[0], "ping", "-n", "-c", str(count), "-i", "0.02", links.addresses[1]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rtts = sorted(float(t) for t in re.findall(r"time=([0-9.]+) ms", times))
    return rtts[0], rtts[len(rtts) // 2]


@dataclass
class Row:
    ranks: int
    name: str
    hosts: str
    devices: list[tuple[str, str]]  # (namespace, device) whose sent bytes are counted
    interface: str  # Open MPI's TCP interface
    short_bytes: int = 0
    runs: list[tuple[float, int]] = field(default_factory=list)  # (tok/s, bytes) of the long runs
    loads: list[float] = field(default_factory=list)


def colibri_run(first: str, args, row: Row, steps: int, agent: Path, out: Path) -> tuple[float, int]:
    env = dict(
        os.environ,
        COLIBRI_SSH_COMMAND=str(agent),
        OMPI_MCA_btl="tcp,self",  # no shared memory between the ranks: every byte crosses the link
        OMPI_MCA_btl_tcp_if_include=row.interface,
        OMPI_MCA_oob_tcp_if_include=row.interface,
    )
    command = [
        *("ip", "netns", "exec", first),
        str(REPO / "colibri"),
        *("run", "--board", "host-mpi", "--model", str(args.model), "--ctx", str(args.ctx), "--out", str(out)),
        *("--hosts", row.hosts, "--prompt-ids", "1,5,9,13", "--steps", str(steps)),
        *("--ignore-eos", "--greedy", "--json"),
    ]
    before = [interface_bytes(ns, dev)[0] for ns, dev in row.devices]
    row.loads.append(load())
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    after = [interface_bytes(ns, dev)[0] for ns, dev in row.devices]
    if done.returncode != 0:
        raise RuntimeError(f"rank_links: {shlex.join(command)} failed:\n{done.stderr[-2000:]}")
    # Every byte counted once, by the namespace that sent it (on loopback: sent and received alike).
    return json.loads(done.stdout)["stats"]["decode_tok_s"], sum(after) - sum(before)


def measure(rows: list[Row], first: str, args, agent: Path, out: Path) -> None:
    few, many = args.steps
    for row in rows:
        row.short_bytes = colibri_run(first, args, row, few, agent, out)[1]
    for _ in range(args.rounds):  # the rounds alternate between the rows
        for row in rows:
            row.runs.append(colibri_run(first, args, row, many, agent, out))


def report(rows: list[Row], args) -> None:
    few, many = args.steps
    for row in rows:
        per_token = (min(b for _, b in row.runs) - row.short_bytes) / (many - few)
        tok_s = max(t for t, _ in row.runs)
        wire = f"{per_token:,.0f}" if "localhost:1" != row.hosts else "none"  # one rank: nothing to send
        loads = f"{min(row.loads):.1f}–{max(row.loads):.1f}"
        print(f"| {row.ranks} | {row.name} | {wire} | {tok_s:.1f} | {1000 / tok_s:.2f} | {loads} |")


def end_cleanly_on_termination() -> None:
    """SIGTERM or SIGHUP (a timeout's kill, a closed terminal) end the run as an exception would:
    simulated_links then removes its namespaces and stops the relay on the way out, instead of
    leaving them to the next run (Python's default for those signals ends the process at once)."""

    def stop(signum, _frame):
        sys.exit(f"rank_links: stopped by {signal.Signals(signum).name}; its namespaces and relay removed")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


def main(argv: list[str]) -> int:
    end_cleanly_on_termination()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "kjv-tiny")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--ranks", default="2", help="rank counts, e.g. 2,4")
    p.add_argument("--steps", default="8,72", help="two step counts: their difference is what is counted")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0.2ms")
    p.add_argument("--link", default="auto", choices=["auto", "netem", "bridge", "relay"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "colibri-rank-links")
    args = p.parse_args(argv)
    args.steps = tuple(int(s) for s in args.steps.split(","))
    rank_counts = [int(n) for n in args.ranks.split(",")]
    try:
        bits_per_second(args.rate), nanoseconds(args.delay)
    except ValueError as e:
        p.error(str(e))
    if os.geteuid() != 0:
        sys.exit("rank_links: run as root (it creates network namespaces)")
    print(f"model {args.model.name}, decode steps {args.steps[0]} and {args.steps[1]}, best of {args.rounds}")
    print("| ranks | link | bytes on the wire per token (all ranks) | decode tok/s | ms per token | load |")
    print("|---|---|---|---|---|---|")
    try:
        for ranks in rank_counts:
            out = args.out.with_name(f"{args.out.name}-ranks{ranks}")
            # Built once, outside the namespaces (its hosts do not change the build).
            build = [str(REPO / "colibri"), "build", "--board", "host-mpi", "--model", str(args.model),
                     "--ctx", str(args.ctx), "--out", str(out), "--ranks", str(ranks), "--json"]  # fmt: skip
            built = subprocess.run(build, capture_output=True, text=True)
            if built.returncode != 0:
                raise RuntimeError(f"rank_links: {shlex.join(build)} failed:\n{built.stderr[-2000:]}")
            with (
                simulated_links(ranks, args.rate, args.delay, args.link) as links,
                tempfile.TemporaryDirectory() as tmp,
            ):
                agent = Path(tmp) / "netns-ssh"
                cases = "\n".join(f"{a}) namespace={n};;" for a, n in zip(links.addresses, links.namespaces))
                agent.write_text(AGENT.format(cases=cases))
                agent.chmod(0o755)
                first = links.namespaces[0]
                low, median = ping_rtt(links)
                print(f"{ranks} ranks, {links.shaped}: ping rank 0 to rank 1 {low:.3f} ms min, {median:.3f} ms "
                      f"median (2 × delay {2 * nanoseconds(args.delay) / 1e6:.3f} ms), load {load():.1f}")  # fmt: skip
                rows = [
                    Row(1, "one rank (no link)", "localhost:1", [(first, "lo")], "lo"),
                    Row(ranks, "loopback (TCP, one namespace)", f"localhost:{ranks}", [(first, "lo")], "lo"),
                    Row(ranks, links.shaped,
                        ",".join(f"{a}:1" for a in links.addresses),
                        list(zip(links.namespaces, links.devices)), f"{SUBNET}.0/24"),
                ]  # fmt: skip
                if ranks != rank_counts[0]:
                    rows = rows[1:]  # one rank alone once
                measure(rows, first, args, agent, out)
                report(rows, args)
    except RuntimeError as e:
        sys.exit(str(e))
    except subprocess.CalledProcessError as e:  # e.g. --link netem on a kernel without sch_netem
        sys.exit(f"rank_links: {shlex.join(e.cmd)} failed: {e.stderr.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
