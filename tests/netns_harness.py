"""Separate hosts, emulated: a deployment whose SuperLink and parties each have their own
Linux network namespace, with TLS, SuperNode authentication, latency and bandwidth.

:class:`NetnsDeployment` builds, for one run:

* a **coordinator** namespace with the SuperLink (``hyfl deploy superlink`` on
  127.0.0.1 there, TLS, ``--enable-supernode-auth``), the job (``flwr run``,
  whose ServerApp Flower starts there too) and the latency relay
  (``tests/latency_relay.py``);
* one namespace per **party** with its SuperNode and worker (what
  ``hyfl deploy party`` starts: ``python -m hyfl.deploy.supernode
  --hyfl-worker``), its Runtime API on 127.0.0.1 there, TLS against the
  harness's CA and its own registered ECDSA key;
* one veth pair per party between its namespace and the coordinator's, with
  a /30 of a private /24 the harness picks so that it overlaps no route and
  no address of the host (:func:`pick_subnet`): ``.4k+1`` on the
  coordinator's side, ``.4k+2`` on party ``k``'s. No namespace has a default
  route, so a party reaches nothing but the relay's address on its link; the
  relay forwards to the SuperLink on the coordinator's loopback, delaying
  each chunk by the one-way latency and pacing it to the bandwidth, in both
  directions (``netem`` is unavailable here).

The parties' node configs are parameters (``data=...`` and any other key a
party's node config takes), written to a TOML file per party as ``hyfl deploy
party`` would pass them; the run config is the job's, as for
:meth:`hyfl.deploy.local.LocalDeployment.run`.

Clean-up: every process runs under :mod:`hyfl.deploy._reaper` (it dies with
this process, SIGKILL included) in its own process group; :meth:`stop` (the
context manager's exit, and an ``atexit`` hook) stops the groups, then what
is left with the deployment's ``FLWR_HOME`` markers, then deletes the
namespaces (their veths go with them). Names carry this process's id and a
counter (``hyfl<pid>n<seq>...``), so parallel pytest workers do not collide;
namespaces left by a process that no longer exists (killed with SIGKILL) are
deleted by the next harness that starts. Every wait has a deadline.

:func:`netns_unavailable` says why the harness cannot run here (not Linux,
not root, no ``ip``, namespaces or veths refused, no Flower), for a clean
``pytest.skip``.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RELAY = HERE / "latency_relay.py"
PREFIX = "hyfl"
_NAME = re.compile(rf"^{PREFIX}(\d+)n\d+[LP]\d*$")
#: Ports inside the namespaces (each namespace has its own, so they never collide).
SUPERLINK_PORT, RELAY_PORT, RUNTIME_PORT = 9000, 9100, 9094
_counter = 0


def _ip(*args: str, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout,
                          check=check)


def _flower_missing() -> str | None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        return "Flower is not installed (pip install 'hyfl[flower]')"
    return None


def netns_unavailable() -> str | None:
    """None if network namespaces and veth pairs can be made here, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    missing = _flower_missing()
    if missing:
        return missing
    probe_a, probe_b = f"{PREFIX}{os.getpid()}n999P0", f"{PREFIX}{os.getpid()}n999P1"
    try:
        for name in (probe_a, probe_b):
            done = _ip("netns", "add", name, check=False)
            if done.returncode != 0:
                return f"ip netns add was refused: {done.stderr.strip()}"
        done = _ip("link", "add", "hfprobe0", "netns", probe_a, "type", "veth", "peer",
                   "name", "hfprobe1", "netns", probe_b, check=False)
        if done.returncode != 0:
            return f"veth pairs cannot be made: {done.stderr.strip()}"
        done = _ip("netns", "exec", probe_a, "true", check=False)
        if done.returncode != 0:
            return f"ip netns exec was refused: {done.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"network namespaces are not usable: {err}"
    finally:
        for name in (probe_a, probe_b):
            _ip("netns", "del", name, check=False)
    return None


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route destination and interface network of the host's namespace."""
    nets = []
    routes = json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst in ("default", ""):
            continue
        try:
            nets.append(ipaddress.ip_network(dst, strict=False))
        except ValueError:
            continue
    for link in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}",
                                             strict=False))
    return [n for n in nets if n.version == 4]


def pick_subnet(seed: int | None = None, attempts: int = 256) -> ipaddress.IPv4Network:
    """A /24 in 10.128.0.0/9 that overlaps no route and no address of the host."""
    taken = _host_networks()
    seed = os.getpid() if seed is None else seed
    for i in range(attempts):
        n = (seed * 7919 + i * 104729) % (1 << 15)
        net = ipaddress.ip_network(f"10.{128 + (n >> 8)}.{n & 255}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free /24 in 10.128.0.0/9 (every candidate overlaps the host's "
                       "routes or addresses)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_namespaces() -> list[str]:
    """Delete the harness's namespaces whose creating process is gone; their names."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    removed = []
    for line in listed:
        name = line.split(" ")[0]
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def write_tls(folder: Path, addresses: Sequence[str]) -> tuple[Path, Path, Path]:
    """A private CA and a SuperLink certificate for ``addresses`` (IP SANs); EC P-256."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hyfl-netns-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, addresses[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def write_supernode_key(path: Path) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format (``ssh-keygen -t ecdsa -b 384 -N ''``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return path


#: Run in the coordinator's namespace: register SuperNode public keys through the
#: Control API of the connection in $FLWR_HOME (what `flwr supernode register` does,
#: for all keys in one process instead of one Flower CLI start each).
_REGISTER = """
import sys
from pathlib import Path
from flwr.cli.flower_config import read_superlink_connection
from flwr.cli.supernode.register import _register_node, try_load_public_key
from flwr.cli.utils import init_http_client_from_connection
client = init_http_client_from_connection(read_superlink_connection(None))
try:
    for path in sys.argv[1:]:
        _register_node(stub=client, public_key=try_load_public_key(Path(path)), is_json=False)
finally:
    client.close()
"""

#: Run in the coordinator's namespace: is the SuperLink's TLS port healthy?
_HEALTH = """
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2, context=context) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
"""


def _stop_groups(processes: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM to every process group at once, SIGKILL to what is left after ``grace``
    seconds (all groups share the deadlines: stopping takes the slowest group's time,
    not the sum)."""
    from hyfl.deploy.local import _live_processes

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for process in processes:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        while time.monotonic() < end:
            for process in processes:
                process.poll()
            groups = {group for _, group, _ in _live_processes().values()}
            if all(process.returncode is not None and process.pid not in groups
                   for process in processes):
                return
            time.sleep(0.1)


class NetnsDeployment:
    """SuperLink and parties in their own network namespaces, TLS and node authentication on,
    links with latency and a bandwidth limit (a relay in the coordinator's namespace).

    Parameters
    ----------
    node_configs : sequence of mapping
        Each party's node config (``party``, ``data``, ``cipher``, ``key``, ``out``...),
        passed to its SuperNode unchanged.
    workdir : path-like
        Folder for certificates, keys, ``FLWR_HOME`` of each side, the app and logs.
    delay_ms : float
        One-way latency added on every link, each direction.
    rate_mbit : float
        Bandwidth of every link, each direction (0: unlimited).
    timeout : float
        Longest life of the deployment in seconds (the relay stops after it;
        :meth:`run` and the start-up have their own deadlines within it).
    node_poll : float
        The SuperNodes' longest idle poll (``$HYFL_SUPERNODE_POLL``).
    """

    def __init__(self, node_configs: Sequence[Mapping[str, Any]], workdir: str | os.PathLike,
                 *, delay_ms: float = 20.0, rate_mbit: float = 0.0, timeout: float = 600.0,
                 node_poll: float = 0.1):
        global _counter
        _counter += 1
        self.node_configs = [dict(c) for c in node_configs]
        self.parties = [int(c["party"]) for c in self.node_configs]
        self.workdir = Path(workdir).resolve()
        self.delay_ms, self.rate_mbit = float(delay_ms), float(rate_mbit)
        self.timeout, self.node_poll = float(timeout), float(node_poll)
        stem = f"{PREFIX}{os.getpid()}n{_counter}"
        self.link_ns = f"{stem}L"
        self.party_ns = {k: f"{stem}P{k}" for k in self.parties}
        self.namespaces: list[str] = []
        self.processes: dict[str, subprocess.Popen] = {}
        self.homes: list[Path] = []
        self._stopped = False
        self._started = time.monotonic()

    # -- addresses -----------------------------------------------------------------
    def link_address(self, k: int) -> str:
        """The coordinator's address on party ``k``'s link (the relay listens there)."""
        return str(self.subnet.network_address + 4 * self._index(k) + 1)

    def party_address(self, k: int) -> str:
        """Party ``k``'s own address on its link."""
        return str(self.subnet.network_address + 4 * self._index(k) + 2)

    def _index(self, k: int) -> int:
        return self.parties.index(k)

    # -- start and stop --------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> NetnsDeployment:
        from hyfl.deploy.local import flower_env, write_app, write_connection

        if len(self.parties) > 63:
            raise ValueError("at most 63 parties (one /30 each in a /24)")
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        sweep_stale_namespaces()
        self.subnet = pick_subnet()
        self._make_namespaces()
        # Certificates for every address a client dials: the relay's on each link and
        # the coordinator's loopback (flwr run, the key registration).
        self.ca, cert, key = write_tls(self.workdir / "tls", [
            "127.0.0.1", *(self.link_address(k) for k in self.parties)])
        self.home = self.workdir / "coordinator" / "flwr_home"
        self.homes.append(self.home)
        self.env = flower_env(self.home)
        self.address = f"127.0.0.1:{SUPERLINK_PORT}"
        write_connection(self.home, self.address, root_certificates=self.ca)
        self.app = write_app(self.workdir / "coordinator" / "app")
        self._spawn("superlink", self.link_ns, self.env, [
            sys.executable, "-m", "hyfl.cli", "deploy", "superlink", "--host", "127.0.0.1",
            "--port", str(SUPERLINK_PORT), "--ssl-ca-certfile", str(self.ca),
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--enable-supernode-auth",
        ])
        self._wait_healthy(deadline)
        # Each party's SuperNode key, registered by the operator (the coordinator).
        keys = {}
        for k in self.parties:
            (self.workdir / f"party-{k}").mkdir(exist_ok=True)
            keys[k] = write_supernode_key(self.workdir / f"party-{k}" / "supernode-key")
        self._in_link([sys.executable, "-c", _REGISTER,
                       *(str(p.with_suffix(".pub")) for p in keys.values())],
                      "registering the SuperNode keys", deadline)
        self.stats_file = self.workdir / "relay-stats.json"
        ready = self.workdir / "relay-ready"
        self._spawn("relay", self.link_ns, self.env, [
            sys.executable, "-I", str(RELAY), "--delay-ms", str(self.delay_ms),
            "--rate-mbit", str(self.rate_mbit), "--allow", str(self.subnet),
            "--lifetime", str(self.timeout), "--ready-file", str(ready),
            "--stats", str(self.stats_file),
            *(a for k in self.parties for a in (
                "--route", f"{self.link_address(k)}:{RELAY_PORT}={self.address}")),
        ])
        self._wait(ready.exists, deadline, "the relay", "relay")
        for config in self.node_configs:
            self._start_party(config, keys[int(config["party"])])
        return self

    def _make_namespaces(self) -> None:
        for ns in (self.link_ns, *self.party_ns.values()):
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        prefix = self.subnet.network_address
        for k in self.parties:
            i = self._index(k)
            near, far = f"hf{os.getpid():x}{_counter}a{i}", f"hf{os.getpid():x}{_counter}b{i}"
            _ip("link", "add", near, "netns", self.link_ns, "type", "veth", "peer", "name", far,
                "netns", self.party_ns[k])
            _ip("-n", self.link_ns, "addr", "add", f"{prefix + 4 * i + 1}/30", "dev", near)
            _ip("-n", self.party_ns[k], "addr", "add", f"{prefix + 4 * i + 2}/30", "dev", far)
            _ip("-n", self.link_ns, "link", "set", near, "up")
            _ip("-n", self.party_ns[k], "link", "set", far, "up")

    def _start_party(self, config: Mapping[str, Any], key: Path) -> None:
        from hyfl.deploy.flower_app import toml_value
        from hyfl.deploy.local import flower_env

        k = int(config["party"])
        folder = self.workdir / f"party-{k}"
        home = folder / "flwr_home"
        self.homes.append(home)
        env = flower_env(home)
        env["HYFL_SUPERNODE_POLL"] = str(self.node_poll)
        node_file = folder / "node-config.toml"
        node_file.write_text("".join(f"{name} = {toml_value(value)}\n"
                                     for name, value in config.items()))
        self._spawn(f"party-{k}", self.party_ns[k], env, [
            sys.executable, "-m", "hyfl.deploy.supernode", "--hyfl-worker",
            "--superlink", f"{self.link_address(k)}:{RELAY_PORT}",
            "--root-certificates", str(self.ca), "--auth-supernode-private-key", str(key),
            "--host", "127.0.0.1", "--port", str(RUNTIME_PORT), "--node-config", str(node_file),
        ])

    def stop(self) -> None:
        """Stop every process (groups, then stragglers by ``FLWR_HOME``), delete the
        namespaces and with them the veths. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        from hyfl.deploy.local import _stop_stragglers

        _stop_groups(list(self.processes.values()), grace=5.0)
        for home in self.homes:
            _stop_stragglers(str(home.resolve()), grace=5.0)
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        atexit.unregister(self.stop)

    def __enter__(self) -> NetnsDeployment:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- runs ------------------------------------------------------------------------
    def run(self, run_config: Mapping[str, Any], *, timeout: float = 300.0,
            name: str = "run", on_progress=None) -> dict:
        """Submit a job with ``flwr run`` from the coordinator's namespace; wait; its
        ``deploy.json`` (``on_progress(record)`` as each round ends, see
        :func:`hyfl.deploy.local.wait_for_results`)."""
        from hyfl.deploy.flower_app import toml_value
        from hyfl.deploy.local import CONNECTION, flower_command, wait_for_results

        overrides = self.workdir / "coordinator" / f"{name}-config.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        process = self._spawn(name, self.link_ns, self.env, [
            flower_command("flwr", self.env), "run", str(self.app), CONNECTION, "--stream",
            "--run-config", str(overrides)])
        return wait_for_results(process, Path(str(run_config["out"])),
                                self.workdir / "logs" / f"{name}.log", timeout=timeout,
                                on_progress=on_progress)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) so far of the deployment's live processes: every
        process carrying one of its ``FLWR_HOME``s (Flower's, the workers, the relay)."""
        from hyfl.deploy.local import _with_home

        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in {pid for home in self.homes for pid in _with_home(str(home.resolve()))}:
            try:
                with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / tick

    def relay_stats(self) -> dict:
        """The relay's counts (connections, peers and bytes per link); written when it stops."""
        return json.loads(self.stats_file.read_text())

    def stop_relay(self) -> dict:
        """Stop the relay now and return its counts."""
        _stop_groups([self.processes["relay"]], grace=15.0)
        return self.relay_stats()

    def leftovers(self) -> dict[str, list]:
        """What of this deployment still exists: namespaces and processes."""
        from hyfl.deploy.local import _with_home

        listed = {line.split(" ")[0] for line in _ip("netns", "list").stdout.splitlines()}
        return {"namespaces": sorted(listed & set(self.namespaces)),
                "processes": [pid for home in self.homes for pid in _with_home(str(home))]}

    # -- helpers -----------------------------------------------------------------------
    def _spawn(self, name: str, ns: str, env: Mapping[str, str],
               command: list[str]) -> subprocess.Popen:
        from hyfl.deploy.local import reaped

        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (the child's)
        try:
            process = subprocess.Popen(["ip", "netns", "exec", ns, *reaped(command)],
                                       stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                       cwd=self.workdir, start_new_session=True)
        finally:
            log.close()
        self.processes[name] = process
        return process

    def _in_link(self, command: list[str], what: str, deadline: float) -> None:
        left = max(1.0, deadline - time.monotonic())
        done = subprocess.run(["ip", "netns", "exec", self.link_ns, *command], env=self.env,
                              capture_output=True, text=True, timeout=left)
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")

    def _wait_healthy(self, deadline: float) -> None:
        def healthy() -> bool:
            try:
                return subprocess.run(
                    ["ip", "netns", "exec", self.link_ns, sys.executable, "-I", "-S", "-c",
                     _HEALTH, f"https://{self.address}/health", str(self.ca)],
                    timeout=5, capture_output=True).returncode == 0
            except subprocess.TimeoutExpired:
                return False

        self._wait(healthy, deadline, "the SuperLink", "superlink")

    def _wait(self, ready, deadline: float, what: str, name: str) -> None:
        while not ready():
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{what} exited at start-up; see "
                                   f"{self.workdir / 'logs' / (name + '.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start in time; see {self.workdir / 'logs'}")
            time.sleep(0.2)
