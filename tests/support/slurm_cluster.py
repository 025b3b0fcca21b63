"""A real single-machine SLURM cluster for tests: munged, MariaDB, slurmdbd, slurmctld and two slurmd nodes.

    from tests.support.slurm_cluster import SlurmCluster, skip_reason

    if skip_reason() is None:          # may apt-get install the Debian packages
        with SlurmCluster() as cluster:  # partition "debug" with nodes n1, n2, accounting on
            ...                          # sbatch / sacct / submitit(cluster="slurm")

Clients (sbatch, sacct, squeue, submitit) read /etc/slurm/slurm.conf, which start() writes after backing up any
existing file; stop() restores it. Every daemon runs in the foreground from Popen; its pid (with its start time,
so a reused pid is never hit) is kept in STATE_FILE, and stop() signals only those pids. A run that died without
stop() is cleaned up by the next start(). Facts behind the settings: /work/shared/notes/slurm.md.

The machine has one cluster (it owns /etc/slurm), and a test session may be several processes (xdist
workers): `shared()` gives each the same one. The first process to ask starts it, the others join it, and
the last one to leave stops it; STATE_FILE lists who uses it, and a file lock makes each of those steps
whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .exclusive import held

STATE_DIR = Path("/tmp/workbench-slurm")
STATE_FILE = STATE_DIR / "pids"  # JSON: owner, users, daemons, backed-up files, /etc/hosts lines added, ports
STATE_LOCK = STATE_DIR / "lock"  # held while a process starts, joins, leaves or stops the cluster
CONF_DIR = Path("/etc/slurm")
HOSTS_FILE = Path("/etc/hosts")
MUNGE_RUN_DIR = Path("/run/munge")
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server")
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "sacctmgr", "sinfo", "squeue", "scancel",
            "munged", "munge", "unmunge", "mariadbd", "mariadb-install-db", "mariadb")
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd")
DB_USER, DB_PASSWORD, DB_NAME = "slurm", "workbench-test", "slurm_acct_db"
FIRST_PORT = 17001  # below submitit's MASTER_PORT range (20000-60000) and the kernel's ephemeral range
HOSTS_MARK = "# workbench-slurm test cluster"
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def _run(cmd: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    """Run a command with a hard time limit; raise RuntimeError with its output if it fails."""
    env = {**os.environ, "PATH": SEARCH_PATH, **kwargs.pop("env", {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)!r} did not finish within {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise RuntimeError(f"{' '.join(cmd)!r} could not run: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-1500:]
        raise RuntimeError(f"{' '.join(cmd)!r} exited {proc.returncode}: {tail}")
    return proc


def _succeeds(cmd: list[str], timeout_s: float = 10, **kwargs) -> bool:
    try:
        _run(cmd, timeout_s, **kwargs)
        return True
    except RuntimeError:
        return False


def _wait_for(what: str, ready: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s")
        time.sleep(0.2)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name, path=SEARCH_PATH) is None]


def ensure_packages() -> str | None:
    """apt-get install the SLURM, munge and MariaDB packages if binaries are missing; return why that failed."""
    if not missing_binaries():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"missing {missing_binaries()} and cannot apt-get install them (needs root and apt-get)"
    install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    try:
        with held("apt"), _services_disabled():  # the browser fixture may be installing Chromium from another worker
            _run(["apt-get", "update"], 300, env={"DEBIAN_FRONTEND": "noninteractive"})
            _run(install, 900, env={"DEBIAN_FRONTEND": "noninteractive"})
    except RuntimeError as exc:
        return f"installing SLURM packages failed: {exc}"
    missing = missing_binaries()
    return f"still missing after apt-get install: {missing}" if missing else None


@contextlib.contextmanager
def _services_disabled() -> Iterator[None]:
    """A policy-rc.d that exits 101 for the duration, so package scripts start no daemons."""
    saved = POLICY_RC_D.read_bytes() if POLICY_RC_D.exists() else None
    POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.write_bytes(saved) if saved is not None else POLICY_RC_D.unlink(missing_ok=True)


def skip_reason() -> str | None:
    """None if a cluster can be started here (installing packages if needed), else why not."""
    if not sys.platform.startswith("linux"):
        return "a SLURM test cluster needs Linux"
    if os.geteuid() != 0:
        return "a SLURM test cluster needs root (it writes /etc/slurm and /etc/hosts and starts daemons)"
    foreign = _foreign_slurm_daemons()
    if foreign:
        return f"SLURM daemons not started by {__name__} are running (pids {foreign}); not replacing their config"
    return ensure_packages()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None if there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def _alive(pid: int, start: int) -> bool:
    """The very process we started (not a reused pid) exists and is not a zombie."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z" and stat[1] == start


_CHILDREN: dict[int, subprocess.Popen] = {}  # daemons started by this process, so they can be reaped


def _terminate(pid: int, start: int, grace_s: float = 15.0) -> None:
    """SIGTERM, wait, then SIGKILL one recorded process. A zombie counts as stopped."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not _alive(pid, start):
            break
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while _alive(pid, start) and time.monotonic() < deadline:
            if pid in _CHILDREN:
                _CHILDREN[pid].poll()
            time.sleep(0.1)
    if pid in _CHILDREN:
        _CHILDREN.pop(pid).poll()


def _load_state() -> dict:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _save_state(state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(STATE_FILE)


def _me() -> dict:
    return {"pid": os.getpid(), "start": _proc_stat(os.getpid())[1]}


def _live_users(state: dict) -> list[dict]:
    """The processes that started or joined the recorded cluster and still run."""
    users = [state["owner"], *state.get("users", [])] if state.get("owner") else state.get("users", [])
    live = [user for user in users if _alive(user["pid"], user["start"])]
    return [user for i, user in enumerate(live) if user not in live[:i]]


def _live_owner(state: dict) -> int | None:
    """The pid of a process that uses the recorded cluster, if one still runs."""
    live = _live_users(state)
    return live[0]["pid"] if live else None


@contextlib.contextmanager
def _state_locked() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Unavailable(RuntimeError):
    """No cluster can run on this machine (the message says why)."""


@contextlib.contextmanager
def shared() -> Iterator[SlurmCluster]:
    """The machine's one test cluster for as long as the block runs: joined if another process of ours runs
    it, else started (installing the packages first if need be); stopped when the last process using it
    leaves. Raises Unavailable where no cluster can run here."""
    me = _me()
    with _state_locked():
        state = _load_state()
        if _live_users(state):
            cluster = SlurmCluster.joined(state)
        else:
            reason = skip_reason()
            if reason is not None:
                raise Unavailable(reason)
            cluster = SlurmCluster().start()
        cluster._state["users"] = [user for user in _live_users(cluster._state) if user != me] + [me]
        _save_state(cluster._state)
    try:
        yield cluster
    finally:
        with _state_locked():
            state = _load_state()
            others = [user for user in _live_users(state) if user != me]
            if not state:
                cluster._state = None  # stopped already (a test stopped it on purpose); nothing of it is left
            elif others:
                state["users"] = others  # still in use: the last one out stops it
                if state.get("owner") == me:  # the owner counts as a user: one that left must not
                    state["owner"] = others[0]
                _save_state(state)
            else:
                cluster._state = state
                cluster.stop()


def _foreign_slurm_daemons() -> list[int]:
    ours = {d["pid"] for d in _load_state().get("daemons", [])}
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            pid = int(proc_dir.name)
            is_slurm = (proc_dir / "comm").read_text().strip() in SLURM_DAEMONS
            if is_slurm and pid not in ours and (_proc_stat(pid) or ("Z",))[0] != "Z":
                found.append(pid)
    return found


def _teardown(state: dict) -> None:
    """Stop recorded daemons (newest first), restore backed-up files and /etc/hosts, forget the state."""
    for daemon in reversed(state.get("daemons", [])):
        _terminate(daemon["pid"], daemon["start"])
    for path, backup in state.get("files", {}).items():
        if backup is None:
            Path(path).unlink(missing_ok=True)
        elif Path(backup).exists():
            shutil.copy2(backup, path)
            Path(backup).unlink()
    added = set(state.get("hosts", []))
    if added and HOSTS_FILE.exists():
        kept = [line for line in HOSTS_FILE.read_text().splitlines() if line not in added]
        HOSTS_FILE.write_text("".join(line + "\n" for line in kept))  # in place: /etc/hosts may be a mount
    STATE_FILE.unlink(missing_ok=True)


def stop_leftovers() -> None:
    """Stop a cluster that an earlier, dead test session left running (known only from STATE_FILE)."""
    state = _load_state()
    if not state or _live_owner(state):
        return
    _teardown(state)
    workdir = Path(state.get("workdir", ""))
    if workdir.name.startswith("workbench-slurm-"):
        shutil.rmtree(workdir, ignore_errors=True)


def _free_ports(count: int) -> list[int]:
    """The first `count` ports from FIRST_PORT up that can be bound now."""
    ports: list[int] = []
    for port in range(FIRST_PORT, 65536):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("0.0.0.0", port))
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports above {FIRST_PORT}")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed again): a controller that does not answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _munge_works() -> bool:
    try:
        return _succeeds(["unmunge"], input=_run(["munge", "-n"], 10).stdout)
    except RuntimeError:
        return False


def _first_job_id() -> int:
    """Tenths of a second, so job ids never repeat across clusters (reused submitit folders stay valid)."""
    return 1 + int(time.time() * 10) % 60_000_000  # below SLURM's MaxJobId (67,043,328)


class SlurmCluster:
    """Partition `debug` over nodes n1, n2 on this machine, with accounting (sacct) through slurmdbd."""

    partition = "debug"

    def __init__(self, nodes: tuple[str, ...] = ("n1", "n2"), start_timeout_s: float = 120.0) -> None:
        self.nodes = list(nodes)
        self.start_timeout_s = start_timeout_s
        self.workdir: Path | None = None
        self.env = {"SLURM_CONF": str(CONF_DIR / "slurm.conf")}
        self.ports: dict[str, int] = {}
        self._state: dict | None = None

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        """Start every daemon and wait until all nodes are idle; on failure stop them and raise RuntimeError."""
        stop_leftovers()
        owner = _live_owner(_load_state())
        if owner:
            raise RuntimeError(f"a SLURM test cluster started by pid {owner} is still running; stop it first")
        self.workdir = Path(tempfile.mkdtemp(prefix="workbench-slurm-"))
        self._state = {"owner": _me(), "workdir": str(self.workdir), "daemons": [], "files": {}, "hosts": [],
                       "nodes": self.nodes}
        _save_state(self._state)
        try:
            self._start_all()
        except Exception as exc:
            message = f"SLURM test cluster failed to start: {exc}\n{self.log_tails()}"
            self.stop(keep_workdir=True)
            raise RuntimeError(message) from exc
        return self

    @classmethod
    def joined(cls, state: dict) -> SlurmCluster:
        """The running cluster `state` records (started by another process), to use and, last, to stop."""
        cluster = cls(tuple(state.get("nodes", ("n1", "n2"))))
        cluster.workdir = Path(state["workdir"])
        cluster.ports = dict(state.get("ports", {}))
        cluster._state = state
        return cluster

    def stop(self, keep_workdir: bool = False) -> None:
        """Cancel remaining jobs, stop only the daemons this cluster started, restore /etc files."""
        if self._state is None:
            return
        self._cancel_jobs()
        _teardown(self._state)
        self._state = None
        if self.workdir is not None and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon log, for error messages."""
        if self.workdir is None:
            return ""
        parts = []
        for log in sorted((self.workdir / "log").glob("*")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log} (last {lines} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    def _start_all(self) -> None:
        for sub in ["log", "state", "mysql", *(f"spool/{node}" for node in self.nodes)]:
            (self.workdir / sub).mkdir(parents=True)
        self._add_hosts_lines()
        self._start_munge()
        port_names = ["mariadb", "slurmdbd", "slurmctld", *self.nodes]
        self.ports = dict(zip(port_names, _free_ports(len(port_names))))
        self._state["ports"] = self.ports
        self._start_mariadb()
        self._write_etc(CONF_DIR / "slurm.conf", self._slurm_conf(), 0o644)
        self._write_etc(CONF_DIR / "slurmdbd.conf", self._slurmdbd_conf(), 0o600)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        _wait_for("slurmdbd", lambda: _port_open(self.ports["slurmdbd"]), 60)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._wait_idle()

    def _spawn(self, name: str, cmd: list[str], **popen_kwargs) -> None:
        with open(self.workdir / "log" / f"{name}.out", "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PATH": SEARCH_PATH, **self.env},
                                    start_new_session=True, **popen_kwargs)
        _CHILDREN[proc.pid] = proc
        self._state["daemons"].append({"name": name, "pid": proc.pid, "start": _proc_stat(proc.pid)[1]})
        _save_state(self._state)

    def _add_hosts_lines(self) -> None:
        known = {name for line in HOSTS_FILE.read_text().splitlines() for name in line.split("#")[0].split()[1:]}
        added = [f"127.0.0.1 {node} {HOSTS_MARK}" for node in self.nodes if node not in known]
        self._state["hosts"] = added
        _save_state(self._state)
        if added:
            with HOSTS_FILE.open("a") as hosts:
                hosts.write("".join(line + "\n" for line in added))

    def _write_etc(self, path: Path, text: str, mode: int) -> None:
        """Write a config file, first backing up an existing one (restored by stop)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        if path.exists():
            backup = STATE_DIR / f"backup-{path.name}"
            shutil.copy2(path, backup)
        self._state["files"][str(path)] = None if backup is None else str(backup)
        _save_state(self._state)
        path.write_text(text)
        path.chmod(mode)

    def _start_munge(self) -> None:
        if _munge_works():  # a munged already serves the default socket: share it
            return
        MUNGE_RUN_DIR.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
        self._spawn("munged", ["munged", "--foreground", "--force"], user="munge", group="munge", extra_groups=[])
        _wait_for("munged", _munge_works, 30)

    def _start_mariadb(self) -> None:
        data = self.workdir / "mysql"
        socket_path = data / "mysqld.sock"
        _run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}", "--skip-test-db"], 180)
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
                                 f"--socket={socket_path}", f"--port={self.ports['mariadb']}",
                                 "--bind-address=127.0.0.1", "--skip-name-resolve", "--skip-log-bin"])
        client = ["mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root", "-e"]
        _wait_for("mariadbd", lambda: _succeeds([*client, "SELECT 1"]), 60)
        user = f"'{DB_USER}'@'127.0.0.1'"
        _run([*client, f"CREATE USER {user} IDENTIFIED BY '{DB_PASSWORD}'; "
                       f"GRANT ALL ON {DB_NAME}.* TO {user};"], 30)

    def _slurm_conf(self) -> str:
        work, host = self.workdir, socket.gethostname().split(".")[0]
        cpus, memory_mb = len(os.sched_getaffinity(0)), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20 // len(self.nodes)
        lines = [
            "ClusterName=workbench", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire (default 120 s) is also how long a requeued job waits before it may start again
            # (job_mgr.c: begin_time = now + cred_expire + 1); 20 s keeps the preemption test's requeue real
            # and a minute and a half shorter, and is still ample for a step's credential on this machine.
            "AuthInfo=cred_expire=20",
            f"StateSaveLocation={work}/state", f"SlurmdSpoolDir={work}/spool/%n",
            f"SlurmctldPidFile={work}/slurmctld.pid", f"SlurmdPidFile={work}/slurmd-%n.pid",
            f"SlurmctldLogFile={work}/log/slurmctld.log", f"SlurmdLogFile={work}/log/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2", "JobRequeue=1",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "MinJobAge=600", "KillWait=2", "OverTimeLimit=0", f"FirstJobId={_first_job_id()}",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['slurmdbd']}", "JobAcctGatherType=jobacct_gather/none",
        ]
        lines += [f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.ports[node]} "
                  f"CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN" for node in self.nodes]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} "
                     "Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _slurmdbd_conf(self) -> str:
        work, host = self.workdir, socket.gethostname().split(".")[0]
        lines = [
            "AuthType=auth/munge", f"DbdHost={host}", "DbdAddr=127.0.0.1", f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root", f"LogFile={work}/log/slurmdbd.log", f"PidFile={work}/slurmdbd.pid",
            "DebugLevel=info", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadb']}", f"StorageUser={DB_USER}", f"StoragePass={DB_PASSWORD}",
            f"StorageLoc={DB_NAME}",
        ]
        return "\n".join(lines) + "\n"

    def _node_states(self) -> dict[str, str]:
        try:
            out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], 15, env=self.env).stdout
        except RuntimeError as exc:
            return {"sinfo": str(exc)}
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def _accounting_ready(self) -> bool:
        """slurmctld has registered the cluster (with its port) in slurmdbd, so sacct will see jobs."""
        cmd = ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster,controlport"]
        try:
            return f"workbench|{self.ports['slurmctld']}" in _run(cmd, 15, env=self.env).stdout.split()
        except RuntimeError:
            return False

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        states = self._node_states()
        while any(states.get(node) != "idle" for node in self.nodes) or not self._accounting_ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ready after {self.start_timeout_s:g} s; sinfo: {states}, "
                                   f"accounting registered: {self._accounting_ready()}")
            time.sleep(0.5)
            states = self._node_states()

    def _cancel_jobs(self) -> None:
        """Cancel jobs still queued or running so no job step outlives the daemons (bounded wait)."""
        try:
            active = lambda: _run(["squeue", "-h", "-o", "%i"], 15, env=self.env).stdout.split()  # noqa: E731
            job_ids = active()
            if job_ids:
                _run(["scancel", *job_ids], 15, env=self.env)
                _wait_for("job cancellation", lambda: not active(), 30)
        except RuntimeError:
            pass  # slurmctld may be gone already; the daemons are stopped regardless
