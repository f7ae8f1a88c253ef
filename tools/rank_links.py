"""Bytes on the wire and decode speed of two MPI ranks over a simulated link, against the same two
ranks over loopback (docs/several-boards.md, "Simulated links and the cost model").

    sudo .venv/bin/python tools/rank_links.py [--model DIR] [--ctx 256] [--steps 8,72] [--rate 1gbit]
        [--delay 0.2ms] [--rounds 3] [--out DIR]

Needs root (it creates network namespaces) and this machine's Open MPI (host-mpi's toolchain). It
builds the host-mpi firmware once (--out), then:

- creates two network namespaces of its own joined by a veth pair (10.77.0.1 and 10.77.0.2), each
  end shaped by `tc qdisc ... netem rate RATE delay DELAY` (or, on a kernel without sch_netem, by
  `tbf rate RATE`: the rate without the delay, said in the output);
- runs `./colibri run --board host-mpi --json` in the first namespace with the ranks on
  `--hosts 10.77.0.1:1,10.77.0.2:1`: mpirun's "ssh" (COLIBRI_SSH_COMMAND) is a script that runs
  the daemon's command in the second namespace (with a hostname of its own) instead of logging in;
  Open MPI is held to its TCP transport on the veth (OMPI_MCA_btl=tcp,self), so every byte the ranks
  exchange crosses the link;
- runs the same two ranks with `--hosts localhost:2` in the first namespace, TCP over its own
  loopback, nothing else on it;
- counts the bytes from the interfaces' counters (`ip -s link`) around each run, for two step
  counts: bytes per decoded token = the difference of bytes / the difference of tokens (the start,
  the prompt and the end cancel out), and takes decode tok/s from the runs' stats (best of
  --rounds).

Everything it creates (namespaces, veth, qdiscs, the script) is removed at the end, also on failure
or Ctrl-C. Nothing but its own namespaces is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUBNET = "10.77.0"

# mpirun's ssh: skip ssh's options (mpirun passes the --remote options: -o NAME=VALUE ...), then
# run the daemon's command line in the second namespace, under a hostname of its own (another
# board), as ssh's remote shell would.
AGENT = """#!/bin/sh
while [ "$#" -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done
shift
exec ip netns exec {namespace} unshare --uts sh -c 'hostname {namespace}; exec sh -c "$0"' "$*"
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass
class Link:
    first: str
    second: str
    veth: str  # the first namespace's end
    shaped: str  # how the link is shaped, as said in the output


def interface_bytes(namespace: str, device: str) -> tuple[int, int]:
    """(tx, rx) bytes of a device in a namespace."""
    stats = json.loads(sh("ip", "-n", namespace, "-j", "-s", "link", "show", "dev", device))[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


@contextmanager
def simulated_link(rate: str, delay: str):
    tag = f"{os.getpid() % 100000}"
    first, second = f"colibri-links-{tag}a", f"colibri-links-{tag}b"
    veth_a, veth_b = f"cla{tag}", f"clb{tag}"
    made = []
    try:
        for namespace in (first, second):
            sh("ip", "netns", "add", namespace)
            made.append(namespace)
        sh("ip", "link", "add", veth_a, "netns", first, "type", "veth", "peer", "name", veth_b, "netns", second)
        shaped = f"netem rate {rate} delay {delay} (each direction)"
        for namespace, veth, address in ((first, veth_a, f"{SUBNET}.1"), (second, veth_b, f"{SUBNET}.2")):
            sh("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", veth)
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
            sh("ip", "-n", namespace, "link", "set", veth, "up")
            try:
                sh("tc", "-n", namespace, "qdisc", "add", "dev", veth, "root", "netem", "rate", rate, "delay", delay)
            except subprocess.CalledProcessError:
                # This kernel has no sch_netem: the rate alone, with a token bucket of a few packets
                # (a larger one lets a whole token's messages through at the veth's own speed).
                sh("tc", "-n", namespace, "qdisc", "add", "dev", veth, "root", "tbf", "rate", rate,
                   "burst", "4kb", "latency", "50ms")  # fmt: skip
                shaped = f"tbf rate {rate}, no added delay (this kernel has no sch_netem)"
        yield Link(first, second, veth_a, shaped)
    finally:
        for namespace in made:  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@dataclass
class Run:
    tok_s: float
    wire_bytes: int  # bytes counted on the interface during the run


def colibri_run(link: Link, args, hosts: str, steps: int, device: str, agent: Path, interface: str) -> Run:
    env = dict(
        os.environ,
        COLIBRI_SSH_COMMAND=str(agent),
        OMPI_MCA_btl="tcp,self",  # no shared memory between the ranks: every byte crosses the link
        OMPI_MCA_btl_tcp_if_include=interface,
        OMPI_MCA_oob_tcp_if_include=interface,
    )
    command = [
        *("ip", "netns", "exec", link.first),
        str(REPO / "colibri"),
        *("run", "--board", "host-mpi", "--model", str(args.model), "--ctx", str(args.ctx), "--out", str(args.out)),
        *("--hosts", hosts, "--prompt-ids", "1,5,9,13", "--steps", str(steps), "--ignore-eos", "--greedy", "--json"),
    ]
    before = interface_bytes(link.first, device)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    after = interface_bytes(link.first, device)
    if done.returncode != 0:
        sys.exit(f"rank_links: {shlex.join(command)} failed:\n{done.stderr[-2000:]}")
    stats = json.loads(done.stdout)["stats"]
    # On the veth every byte is counted once each way; on loopback once as sent and once as received.
    wire = (after[0] - before[0]) + (after[1] - before[1]) if device != "lo" else after[0] - before[0]
    return Run(stats["decode_tok_s"], wire)


def measure(link: Link, args, hosts: str, device: str, agent: Path, interface: str) -> tuple[float, float]:
    """(bytes on the wire per decoded token, both ranks together; best decode tok/s)."""
    few, many = args.steps
    short = colibri_run(link, args, hosts, few, device, agent, interface)
    runs = [colibri_run(link, args, hosts, many, device, agent, interface) for _ in range(args.rounds)]
    per_token = (min(r.wire_bytes for r in runs) - short.wire_bytes) / (many - few)
    return per_token, max(r.tok_s for r in runs)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "kjv-tiny")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--steps", default="8,72", help="two step counts: their difference is what is counted")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0.2ms")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "colibri-rank-links")
    args = p.parse_args(argv)
    args.steps = tuple(int(s) for s in args.steps.split(","))
    if os.geteuid() != 0:
        sys.exit("rank_links: run as root (it creates network namespaces)")
    # Built once, outside the namespaces (its hosts do not change the build).
    subprocess.run([str(REPO / "colibri"), "build", "--board", "host-mpi", "--model", str(args.model),
                    "--ctx", str(args.ctx), "--out", str(args.out), "--json"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    with simulated_link(args.rate, args.delay) as link, tempfile.TemporaryDirectory() as tmp:
        agent = Path(tmp) / "netns-ssh"
        agent.write_text(AGENT.format(namespace=link.second))
        agent.chmod(0o755)
        rows = [
            ("one rank (no link)", *measure(link, args, "localhost:1", "lo", agent, "lo")),
            ("loopback (TCP, one namespace)", *measure(link, args, "localhost:2", "lo", agent, "lo")),
            (
                f"veth, {link.shaped}",
                *measure(link, args, f"{SUBNET}.1:1,{SUBNET}.2:1", link.veth, agent, f"{SUBNET}.0/24"),
            ),
        ]
    print(f"model {args.model.name}, 2 ranks, decode steps {args.steps[0]} and {args.steps[1]}, best of {args.rounds}")
    print("| link | bytes on the wire per token (both ranks) | decode tok/s | ms per token |")
    print("|---|---|---|---|")
    for name, per_token, tok_s in rows:
        wire = f"{per_token:,.0f}" if name != rows[0][0] else "none"  # one rank: nothing to send
        print(f"| {name} | {wire} | {tok_s:.1f} | {1000 / tok_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
