"""Emulated nodes on one machine: network namespaces joined by a throttled link.

Each node is a namespace ``<prefix>-n<i>`` with one interface ``nic0`` (address
``<subnet>.<i+1>/24``), the peer end of a veth pair whose other end ``p<i>`` sits on a
bridge in the "switch" namespace ``<prefix>-sw``. ``set_rate("1gbit")`` puts a ``tc tbf``
qdisc on both ends of every veth, so each node gets a full-duplex link at that rate;
ranks of one node share its namespace and talk to each other over its loopback (never
throttled). Measured goodputs: docs/architecture.md, "Running on a CPU-only machine".

Needs root (``have_root()`` says why not). Only private addresses; the namespaces have no
route off the machine. ``setup()`` and ``teardown()`` are idempotent: ``setup`` removes
leftovers of an earlier crashed run with the same prefix, but refuses (RuntimeError) to
touch namespaces with processes still running in them (another run's: pick another
``prefix``); ``teardown`` kills the processes still inside the namespaces this object
created (by pid: only what we launched there) before deleting them. Used as a context
manager it also tears down at interpreter exit and on SIGINT / SIGTERM / SIGHUP::

    with Netns(nodes=2) as net:
        net.set_rate("1gbit")
        subprocess.run([*net.exec_prefix(0), "python", ...])
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import time

NIC = "nic0"


def have_root() -> tuple[bool, str]:
    """Whether this process can build namespaces; the reason if not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "network namespaces and tc need root (run as root, or skip this benchmark)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return False, f"missing tools: {', '.join(missing)} (iproute2)"
    return True, ""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


class Netns:
    """``nodes`` namespaces behind one bridge; see the module docstring."""

    def __init__(self, nodes: int = 2, prefix: str = "hfcb", subnet: str = "10.77.0") -> None:
        if not 1 <= nodes <= 250:
            raise ValueError(f"nodes={nodes}: allowed 1..250")
        if len(f"{prefix}-sw") > 15 or not prefix.replace("-", "").isalnum():
            raise ValueError(f"prefix={prefix!r}: short alphanumeric (a namespace name)")
        octets = subnet.split(".")
        if len(octets) != 3 or not (octets[0] == "10" or octets[:2] == ["192", "168"]):
            raise ValueError(f"subnet={subnet!r}: three octets of a private range (10.x.y, "
                             f"192.168.x)")
        self.nodes, self.prefix, self.subnet = nodes, prefix, subnet
        self.switch = f"{prefix}-sw"
        self.names = [f"{prefix}-n{i}" for i in range(nodes)]
        self.rate: str | None = None
        self.created = False      # this object made the namespaces (may kill inside them)
        self._handlers: dict[int, object] = {}

    # -- addresses and launching ----------------------------------------------------------
    def addr(self, node: int) -> str:
        return f"{self.subnet}.{node + 1}"

    def exec_prefix(self, node: int) -> list[str]:
        """Command prefix that runs a program inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.names[node]]

    # -- set-up / tear-down ---------------------------------------------------------------
    def existing(self) -> list[str]:
        out = _run("ip", "netns", "list", check=False).stdout.split("\n")
        present = {line.split()[0] for line in out if line.strip()}
        return [ns for ns in (*self.names, self.switch) if ns in present]

    def pids(self, ns: str) -> list[int]:
        return [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]

    def setup(self) -> "Netns":
        """Fresh namespaces, veths, bridge, addresses; no rate limit yet."""
        ok, why = have_root()
        if not ok:
            raise PermissionError(why)
        if not self.created:
            busy = {ns: self.pids(ns) for ns in self.existing()}
            busy = {ns: p for ns, p in busy.items() if p}
            if busy:
                raise RuntimeError(f"network namespaces {sorted(busy)} exist with processes "
                                   f"running in them (pids {sorted(sum(busy.values(), []))}): "
                                   f"another run uses prefix {self.prefix!r}; choose another")
        self.created = True       # leftovers (no processes) and our own set-up are ours
        self.teardown()
        self.created = True
        try:
            sw = self.switch
            _run("ip", "netns", "add", sw)
            _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", sw, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                _run("ip", "netns", "add", ns)
                _run("ip", "-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name",
                     NIC, "netns", ns)
                _run("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0")
                _run("ip", "-n", sw, "link", "set", f"p{i}", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", NIC)
                _run("ip", "-n", ns, "link", "set", NIC, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def set_rate(self, rate: str | None, burst: str = "256kb", latency: str = "50ms") -> None:
        """Throttle every node's link to ``rate`` (tc syntax: "100mbit", "1gbit") in both
        directions; None removes the limit."""
        for i, ns in enumerate(self.names):
            for where, dev in ((ns, NIC), (self.switch, f"p{i}")):
                if rate is None:
                    _run("tc", "-n", where, "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    _run("tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf",
                         "rate", rate, "burst", burst, "latency", latency)
        self.rate = rate

    def tx_bytes(self, node: int) -> int:
        """Bytes node ``node`` has sent over its link (the throttled direction out of it)."""
        out = _run("ip", "-j", "-s", "-n", self.names[node], "link", "show", "dev", NIC).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"])

    def teardown(self) -> None:
        """Kill what still runs inside the namespaces this object created, then delete them
        (idempotent; namespaces it did not create are left alone)."""
        if not self.created:
            return
        for ns in self.existing():
            pids = self.pids(ns)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
                time.sleep(0.05)
            _run("ip", "netns", "del", ns, check=False)
        self.rate = None
        self.created = False

    # -- context manager with exit and signal clean-up ------------------------------------
    def __enter__(self) -> "Netns":
        atexit.register(self.teardown)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            return self.setup()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.teardown()
        finally:
            atexit.unregister(self.teardown)
            for sig, old in self._handlers.items():
                signal.signal(sig, old)
            self._handlers.clear()

    def _on_signal(self, signum, frame) -> None:
        self.teardown()
        old = self._handlers.get(signum)
        if callable(old):
            old(signum, frame)
        else:
            raise SystemExit(128 + signum)
