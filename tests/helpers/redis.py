"""A real redis-server on a free loopback port, for shared state's tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server on a free loopback port, that a test may stop and start again
    (``STREAMRES_REDIS_SERVER=/path/to/valkey-server`` runs the same tests on Valkey)."""

    def __init__(self, tmp: Path, exe: str | None = None) -> None:
        exe = exe or os.environ.get("STREAMRES_REDIS_SERVER") or shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.exe, self.tmp, self.port = exe, tmp, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def pids(self) -> list[int]:
        return [] if self.proc is None else [self.proc.pid]

    def primaries(self) -> list[str]:
        return [self.url]

    def close(self) -> None:
        self.stop()


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start ({proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not start")


def _cli(exe: str, port: int, *args: str, password: str | None = None) -> str:
    cli = str(Path(exe).with_name(Path(exe).name.replace("-server", "-cli")))
    if not Path(cli).exists():
        cli = shutil.which("redis-cli") or "redis-cli"
    env = {**os.environ, "REDISCLI_AUTH": password} if password else None
    done = subprocess.run(
        [cli, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=env,
    )
    return done.stdout


class _Servers:
    """Several redis-servers on free loopback ports (a cluster, a primary and its replica),
    each of which :meth:`stop` kills and :meth:`start` starts again as it was."""

    def __init__(self, tmp: Path, password: str | None = None) -> None:
        exe = os.environ.get("STREAMRES_REDIS_SERVER") or shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.exe, self.tmp, self.password = exe, tmp, password
        #: ``user:password@`` for the URL (the default user), or nothing.
        self.auth = f":{password}@" if password else ""
        #: The data servers' command lines, by port, and those running.
        self.commands: dict[int, list[str]] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.url = ""

    def _command(self, port: int, *extra: str) -> list[str]:
        base = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.password:
            base += ["--requirepass", self.password, "--masterauth", self.password]
        return [self.exe, *base, "--dir", str(self.tmp), *extra]

    def cli(self, port: int, *args: str) -> str:
        """``redis-cli`` to one of them (with the password, for a data server)."""
        return _cli(
            self.exe, port, *args, password=self.password if port in self.commands else None
        )

    def _server(self, port: int, *extra: str) -> None:
        self.commands[port] = self._command(port, *extra)
        self._run(port)

    def _run(self, port: int) -> None:
        proc = subprocess.Popen(self.commands[port], stdout=subprocess.DEVNULL)
        self.procs[port] = proc
        _wait_for_port(port, proc, self.exe)

    def stop(self) -> None:
        """Kill every data server (SIGKILL: nothing saved)."""
        for port in list(self.commands):
            proc = self.procs.pop(port, None)
            if proc is not None:
                proc.kill()
                proc.wait(timeout=10)

    def start(self) -> None:
        """Start every data server again (empty)."""
        for port in self.commands:
            self._run(port)

    def pids(self) -> list[int]:
        """The data servers' processes (to pause with SIGSTOP)."""
        return [proc.pid for proc in self.procs.values()]

    def primaries(self) -> list[str]:
        """A plain ``redis://`` URL for each primary (to empty it, to fill it)."""
        raise NotImplementedError

    def close(self) -> None:
        self.stop()


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port + 10000)) != 0:
                return port


class RedisClusterServers(_Servers):
    """A real three-primary Redis Cluster on loopback (``--cluster-enabled yes`` on three ports,
    joined by ``redis-cli --cluster create``)."""

    def __init__(self, tmp: Path, password: str | None = None) -> None:
        super().__init__(tmp, password)
        self.ports = [_cluster_port() for _ in range(3)]
        nodes = f"127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}"
        self.url = f"redis+cluster://{self.auth}{nodes}"

    def create(self) -> None:
        for port in self.ports:
            self._server(
                port,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--cluster-node-timeout",
                "2000",
            )
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        self.cli(self.ports[0], "--cluster", "create", *nodes, "--cluster-yes")
        self._wait_ok()

    def start(self) -> None:
        """Start the nodes again: empty, but each knows the cluster (its nodes file)."""
        super().start()
        self._wait_ok()

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            # Every node serving, and every node's map of the slots the same one (a node that
            # has not yet learnt its peers' addresses answers a client differently).
            if all("cluster_state:ok" in self.cli(p, "cluster", "info") for p in self.ports):
                maps = {self.cli(p, "cluster", "slots") for p in self.ports}
                if len(maps) == 1:
                    return
            time.sleep(0.05)
        raise RuntimeError("the cluster did not come up")

    def primaries(self) -> list[str]:
        return [f"redis://{self.auth}127.0.0.1:{p}/0" for p in self.ports]


class RedisSentinelServers(_Servers):
    """A real primary with one replica, watched by a Sentinel (``redis-server --sentinel``),
    which :meth:`fail_over` makes move the primary to the replica."""

    SERVICE = "streamres-test"

    def __init__(self, tmp: Path, password: str | None = None) -> None:
        super().__init__(tmp, password)
        self.primary, self.replica, self.sentinel = (free_port() for _ in range(3))
        self.url = f"redis+sentinel://{self.auth}127.0.0.1:{self.sentinel}/{self.SERVICE}/0"
        self.watcher: subprocess.Popen[bytes] | None = None

    def create(self) -> None:
        self._server(self.primary)
        self._server(self.replica, "--replicaof", "127.0.0.1", str(self.primary))
        conf = self.tmp / f"sentinel-{self.sentinel}.conf"
        conf.write_text(
            f"port {self.sentinel}\nbind 127.0.0.1\ndir {self.tmp}\n"
            f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary} 1\n"
            # A failover only when asked (``fail_over``): a pause or a restart stays one.
            f"sentinel down-after-milliseconds {self.SERVICE} 60000\n"
            f"sentinel failover-timeout {self.SERVICE} 5000\n"
            + (f"sentinel auth-pass {self.SERVICE} {self.password}\n" if self.password else "")
        )
        self.watcher = subprocess.Popen(
            [self.exe, str(conf), "--sentinel"], stdout=subprocess.DEVNULL
        )
        _wait_for_port(self.sentinel, self.watcher, f"{self.exe} --sentinel")
        self._wait_primary(self.primary)
        self._wait_synced()

    def _wait_synced(self) -> None:
        deadline = time.monotonic() + 20
        while "master_link_status:up" not in self.cli(self.replica, "info", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)

    def _wait_primary(self, port: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = self.cli(self.sentinel, "sentinel", "get-master-addr-by-name", self.SERVICE)
            if got.split() == ["127.0.0.1", str(port)]:
                return
            time.sleep(0.05)
        raise RuntimeError(f"Sentinel did not name 127.0.0.1:{port} the primary")

    def fail_over(self) -> None:
        """Sentinel promotes the replica (``SENTINEL FAILOVER``); returns once it names it and
        the old primary follows it."""
        self.cli(self.sentinel, "sentinel", "failover", self.SERVICE)
        self._wait_primary(self.replica)
        self.primary, self.replica = self.replica, self.primary
        self.commands[self.primary] = self._command(self.primary)
        self.commands[self.replica] = self._command(
            self.replica, "--replicaof", "127.0.0.1", str(self.primary)
        )
        deadline = time.monotonic() + 30
        while "role:slave" not in self.cli(self.replica, "info", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError("the old primary did not follow the new one")
            time.sleep(0.05)
        self._wait_synced()

    def start(self) -> None:
        super().start()
        self._wait_synced()

    def primaries(self) -> list[str]:
        return [f"redis://{self.auth}127.0.0.1:{self.primary}/0"]

    def close(self) -> None:
        super().close()
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher.wait(timeout=10)


#: Any of them, as the tests use them.
Servers = RedisServer | RedisClusterServers | RedisSentinelServers


#: The ways operators run Redis that shared state's tests run against (``redis_servers``).
TOPOLOGIES = ["redis", "valkey", "cluster", "sentinel"]

#: A shared-state test on every topology (on asyncio), and on one Redis on trio too.
EVERY_REDIS = pytest.mark.parametrize(
    ("anyio_backend", "redis_servers"),
    [*(("asyncio", t) for t in TOPOLOGIES), ("trio", "redis")],
    indirect=["redis_servers"],
)

#: The same where the test runs on asyncio only (uvicorn, processes of their own).
EVERY_REDIS_ASYNCIO = pytest.mark.parametrize("redis_servers", TOPOLOGIES, indirect=True)


@asynccontextmanager
async def connected(url: str, **options: Any) -> AsyncIterator[Any]:
    """A coredis client for what a shared-state URL names, as shared state reads it."""
    from streamres._shell.shared.servers import Servers as Parsed

    client, enter = Parsed.parse(url).client(**options)
    async with enter():
        yield client
