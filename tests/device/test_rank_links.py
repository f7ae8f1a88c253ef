"""The simulated links tools/rank_links.py puts between MPI ranks (docs/several-boards.md,
"Simulated links and the cost model"): N network namespaces on a bridge, and the delay line that
stands in for netem on a kernel without it (a relay process between TAP devices adding the delay
and holding the rate). No firmware: the links alone, each test a few seconds. Root: CI runs as root."""

import importlib.util
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("rank_links", REPO / "tools" / "rank_links.py")
rank_links = importlib.util.module_from_spec(spec)
sys.modules["rank_links"] = rank_links  # its dataclasses look their module up
spec.loader.exec_module(rank_links)


def can_make_network_namespaces() -> bool:
    if not shutil.which("ip") or not shutil.which("ping"):
        return False
    probe = subprocess.run(["ip", "netns", "add", "colibri-links-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "colibri-links-probe"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not can_make_network_namespaces(), reason="network namespaces need root")


def ping_ms(namespace: str, address: str, count: int = 5, size: int = 56) -> list[float]:
    """Each echo's round trip, in ms (every echo answered, or the test fails)."""
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, "ping", "-n", "-c", str(count), "-i", "0.05", "-W", "2", "-s", str(size),
         address],
        capture_output=True, text=True,
    )  # fmt: skip
    times = [float(t) for t in re.findall(r"time=([0-9.]+) ms", done.stdout)]
    assert len(times) == count, done.stdout + done.stderr
    return times


def namespaces_now() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
            .stdout.splitlines() if line.strip()}  # fmt: skip


def test_four_ranks_on_a_bridge_reach_each_other_and_nothing_is_left():
    with rank_links.simulated_links(4, rate="1gbit", delay="0", kind="bridge") as links:
        made = set(links.namespaces) | set(links.own)
        assert len(links.namespaces) == 4 and made <= namespaces_now()
        for source in range(4):
            for target in range(4):
                if source != target:
                    ping_ms(links.namespaces[source], links.addresses[target], count=1)
    assert not made & namespaces_now()


def test_the_links_are_removed_when_the_run_fails():
    with pytest.raises(KeyboardInterrupt), rank_links.simulated_links(2, rate="1gbit", delay="1ms") as links:
        made = set(links.namespaces) | set(links.own)
        relay = links.relay
        raise KeyboardInterrupt
    assert not made & namespaces_now()
    assert relay is None or relay.poll() is not None


STOPPED_WHILE_LINKED = """
import sys, time
sys.path.insert(0, sys.argv[1])
import rank_links
rank_links.end_cleanly_on_termination()
with rank_links.simulated_links(2, rate="1gbit", delay="1ms", kind="relay") as links:
    print(" ".join([*links.namespaces, *links.own, str(links.relay.pid)]), flush=True)
    time.sleep(60)
"""


def test_a_run_stopped_by_sigterm_removes_its_links_and_relay():
    """What a timeout's kill or a closed terminal sends: the namespaces and the relay go with the run."""
    import os
    import signal

    run = subprocess.Popen(
        [sys.executable, "-c", STOPPED_WHILE_LINKED, str(REPO / "tools")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    *made, relay_pid = run.stdout.readline().split()
    assert set(made) <= namespaces_now()
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 1 and err.strip() == "rank_links: stopped by SIGTERM; its namespaces and relay removed"
    assert not set(made) & namespaces_now()
    with pytest.raises(ProcessLookupError):
        os.kill(int(relay_pid), 0)


def test_the_delay_line_delays_each_way_and_holds_the_rate():
    """A relay between three TAPs (MAC learning: the echo and its answer reach the right namespace;
    the first ARP request broadcast): the round trip is twice the set delay plus a little (a loaded
    machine's scheduling: at most 4 ms in the test), both ways; a 30,000-byte echo (21 frames) at
    10 Mb/s takes its serialisation too, once each way (the links into the relay and out of it
    pipelined frame by frame, as a switch's)."""
    delay_ms = 5
    with rank_links.simulated_links(3, rate="10mbit", delay=f"{delay_ms}ms", kind="relay") as links:
        assert "relay" in links.shaped
        first, second, third = links.namespaces
        for source, address in ((first, links.addresses[2]), (third, links.addresses[0]), (second, links.addresses[0])):
            rtt = sorted(ping_ms(source, address))
            assert 2 * delay_ms <= rtt[0] and rtt[len(rtt) // 2] <= 2 * delay_ms + 4, rtt
        serialised = 2 * (30_000 + 21 * 42) * 8 / 10e6 * 1000  # ms, both ways: 21 frames of 42 bytes' headers
        big = sorted(ping_ms(first, links.addresses[1], count=3, size=30_000))
        assert 2 * delay_ms + serialised <= big[0] <= 2 * delay_ms + serialised + 10, big
