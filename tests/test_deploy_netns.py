"""Separate hosts, emulated: the SuperLink and each party in its own network namespace.

* The latency relay on loopback (no root needed, ~2 s): a round trip through it
  takes at least twice the one-way latency, a bulk transfer is paced to the
  bandwidth, and addresses outside loopback and the allowed networks are
  refused.
* A real job across namespaces (root; skipped where network namespaces are not
  permitted, with the reason): SuperLink, ServerApp and ``flwr run`` in the
  coordinator's namespace, two organisations each in its own with its own file
  (tests/synthetic_data.py's ``organisation_files``: other ids, partly shared,
  other columns, text labels), TLS and SuperNode authentication on, 20 ms
  one-way latency and 100 Mbit/s on every link. The parties align their files
  over the links, the model reaches relative loss 1e-3, every party's traffic
  went through its own link, and nothing -- process, namespace, veth -- is left.
  (The loopback tests check a deployment against ``run_protocol`` bit for bit.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hyfl.data import load_party_spec
from hyfl.deploy.config import run_config_for
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import evaluate
from netns_harness import RELAY, NetnsDeployment, netns_unavailable
from synthetic_data import organisation_files

DELAY_MS, RATE_MBIT = 20.0, 100.0


# ----------------------------------------------------------------------------- the relay


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(20)

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(20)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_relay_delays_paces_and_refuses_other_addresses(tmp_path):
    server, port = _echo_server()
    listen = _free_port()
    stats, ready = tmp_path / "stats.json", tmp_path / "ready"
    relay = subprocess.Popen([
        sys.executable, "-I", str(RELAY), "--route", f"127.0.0.1:{listen}=127.0.0.1:{port}",
        "--delay-ms", "25", "--rate-mbit", "40", "--lifetime", "30", "--ready-file", str(ready),
        "--stats", str(stats)])
    try:
        end = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < end and relay.poll() is None, "the relay did not start"
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", listen), timeout=10) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trips = []
            for _ in range(3):
                tic = time.perf_counter()
                conn.sendall(b"x")
                assert conn.recv(10) == b"x"
                trips.append(time.perf_counter() - tic)
            assert min(trips) >= 0.050  # 25 ms each way
            # 1 MB out and back: 8 Mbit each way over a 40 Mbit/s link: >= 0.2 s + latency.
            data = b"y" * 1_000_000
            got = []

            def read_back() -> None:
                while sum(map(len, got)) < len(data):
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        return
                    got.append(chunk)

            reader = threading.Thread(target=read_back)
            tic = time.perf_counter()
            reader.start()
            conn.sendall(data)
            reader.join(20)
            took = time.perf_counter() - tic
            assert b"".join(got) == data
            assert took >= 0.2 + 0.05
    finally:
        relay.terminate()
        relay.wait(10)
        server.close()
    counts = json.loads(stats.read_text())["routes"][0]
    assert counts["connections"] == 1 and counts["peers"] == ["127.0.0.1"]
    assert counts["bytes_up"] == counts["bytes_down"] == 3 + len(data)
    # Neither end may be an address the caller did not allow.
    for route in ("192.0.2.7:9000=127.0.0.1:9", "127.0.0.1:9000=198.51.100.1:80"):
        refused = subprocess.run([sys.executable, "-I", str(RELAY), "--route", route,
                                  "--allow", "10.0.0.0/24", "--lifetime", "1"],
                                 capture_output=True, text=True, timeout=20)
        assert refused.returncode != 0 and "refused" in refused.stderr


# ----------------------------------------------------------------------------- the harness


def test_the_harness_says_why_it_cannot_run(monkeypatch):
    import netns_harness

    monkeypatch.setattr(netns_harness.os, "geteuid", lambda: 1000)
    assert netns_harness.netns_unavailable() == "network namespaces need root (ip netns add)"
    monkeypatch.setattr(netns_harness.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns_harness.shutil, "which", lambda name: None)
    assert "the ip command" in netns_harness.netns_unavailable()
    monkeypatch.setattr(netns_harness.shutil, "which", lambda name: "/sbin/ip")
    monkeypatch.setattr(netns_harness, "_flower_missing", lambda: None)

    def refused(*args, **kwargs):
        return subprocess.CompletedProcess(["ip", *args], 1, "", "Operation not permitted")

    monkeypatch.setattr(netns_harness, "_ip", refused)
    assert netns_harness.netns_unavailable() == (
        "ip netns add was refused: Operation not permitted")


def test_the_harness_picks_a_subnet_clear_of_the_hosts_networks(monkeypatch):
    import ipaddress

    import netns_harness

    taken = [ipaddress.ip_network("10.128.0.0/9")]  # every candidate: refused
    monkeypatch.setattr(netns_harness, "_host_networks", lambda: taken)
    with pytest.raises(RuntimeError, match="no free /24"):
        netns_harness.pick_subnet(seed=5)
    monkeypatch.setattr(netns_harness, "_host_networks", lambda: [])
    first = netns_harness.pick_subnet(seed=5)
    # The host uses the first candidate (a wider route than it): the next one is taken.
    taken = [ipaddress.ip_network(f"{first.network_address}/23", strict=False)]
    monkeypatch.setattr(netns_harness, "_host_networks", lambda: taken)
    second = netns_harness.pick_subnet(seed=5)
    assert second.prefixlen == 24 and not second.overlaps(taken[0])
    assert second.subnet_of(ipaddress.ip_network("10.128.0.0/9"))


# ----------------------------------------------------------------------------- a real job


@pytest.fixture(scope="module")
def netns():
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")


@pytest.mark.slow
def test_organisations_files_train_across_network_namespaces_to_the_optimum(tmp_path, netns):
    """Two organisations, each with its own file (different ids, partly overlapping,
    different columns, text labels) in its own namespace: the alignment and the rounds
    cross their links, the model reaches relative loss 1e-3, no file leaves its party."""
    files, *_ = organisation_files(tmp_path / "files")
    bank, shop = files[0], files[2]  # customers 0-59 and 40-89, x0-x2 and x6-x8
    # Each party's own node config: its file and policy, as `hyfl deploy party` sets it.
    nodes = [{"party": k, "cipher": "none", "data": str(path), "id-column": "customer",
              "label-column": "income", "out": str(tmp_path / f"out-{k}")}
             for k, path in enumerate((bank, shop))]
    out = tmp_path / "results"
    rounds, lam = 3, 0.2
    run_config = run_config_for(parties=2, iterations=rounds, cipher="none", lam=lam,
                                out=str(out), reply_timeout=60.0)
    started = time.perf_counter()
    deployment = NetnsDeployment(nodes, tmp_path / "netns", delay_ms=DELAY_MS,
                                 rate_mbit=RATE_MBIT, timeout=240)
    with deployment:
        up = time.perf_counter() - started
        results = deployment.run(run_config, timeout=300)
        relay = deployment.stop_relay()
    elapsed = time.perf_counter() - started
    assert results["status"] == "completed"
    assert results["alignment"]["n_samples"] == 90 and results["alignment"]["shared"] == [20, 20]
    # The pooled problem, read here only to judge the model: features in the order of
    # first appearance, samples in any order (the objective does not depend on it).
    dataset, _ = load_party_spec(f"parties:{bank},{shop};id=customer;label=income", psi=False)
    problem = make_problem(dataset, "hinge", lam)
    optimum = solve_centralized(problem, cache=False)
    with np.load(out / "weights.npz") as f:
        w = f["w"][-1]
    assert evaluate(problem, w, None, optimum, None)["relative_loss"] <= 1e-3
    assert results["rounds"][-1]["certificate"]["gap"] <= 1e-2 * optimum.primal
    # Every party's traffic went through its own link, from its own address, both ways;
    # a message's round trip includes at least one crossing each way.
    for k, route in enumerate(relay["routes"]):
        assert route["listen"] == f"{deployment.link_address(k)}:9100"
        assert route["peers"] == [deployment.party_address(k)]
        assert route["bytes_up"] > 10_000 and route["bytes_down"] > 10_000
    assert min(r["round_trip_mean"] for r in results["rounds"]) >= 2 * DELAY_MS / 1000
    assert deployment.leftovers() == {"namespaces": [], "processes": []}
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                                timeout=10).stdout
    assert f"hf{os.getpid():x}" not in host_links
    print(f"\nnetns: {elapsed:.1f} s in all ({up:.1f} s to start); seconds per round "
          f"{[round(r['round_seconds'], 2) for r in results['rounds']]}; relay "
          f"{[(r['bytes_up'], r['bytes_down']) for r in relay['routes']]}")
