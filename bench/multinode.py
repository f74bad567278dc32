#!/usr/bin/python3
"""Multi-node benchmarks of ft-launcher and torchrun (c10d), nodes on loopback.

Every node is one launcher process on this machine (ft-launcher: --local-addr
127.0.0.<2+i>; torchrun 1.13 has no --local-addr, so its agents all say
localhost). The rendezvous endpoint is 127.0.0.2:<free port>, hosted by node 0
(ft-launcher: its embedded etcd; torchrun: its c10d TCPStore, is_host=1 on
node 0 and 0 elsewhere so the host is deterministic). Workers are
bench/workers/mn_worker.py (stdlib Python, no torch): rank 0 listens on
MASTER_ADDR:MASTER_PORT, the other ranks keep a TCP connection to it and
exchange a byte every 50 ms; 1 s of silence makes a rank exit 1, as NCCL with
async error handling would.

Scenarios (repetitions alternate launchers so background load hits both):
  swap      ft-launcher only: --nnodes 3:4, one spare. Variants in one run:
            "no filler", "filler" (--spare-filler: a process tree of sleeps
            on the spare, reclaimed on promotion) and "etcd member" (three
            embedded etcd members on nodes 0-2, filler on the spare, the
            powered-off node hosts a member), and "silent" (the node's
            launcher and ranks are frozen with SIGSTOP instead: gossip
            suspicion must confirm it; the frozen node is SIGKILLed after
            the measurement). Latency as nodeloss, split into phases from
            the promoted spare's spare_swap event: detect (kill -> round
            opened), of which "detector" is the detecting node's own time
            from the first evidence (closed connection, last gossip ack) to
            the round's end, rendezvous, filler reclaim, spawn.
  nodeloss  --nnodes 3:4, 4 launchers. When round 0 is ready, one active node
            that does not host the rendezvous (node 1 if active) is powered
            off: its launcher and every process under it get SIGKILL in one
            loop. Latency = max start stamp of the first complete round after
            the kill (3 nodes x nproc ranks, same MASTER) - kill time.
  crash     --nnodes 4, 4 launchers. Node 1's local rank 0 exits 1 one second
            after round 0 is ready. Latency = max start stamp of the first
            complete round after the crash (4 x nproc ranks) - crash stamp.
  stall     --nnodes 4: node 1's launcher and ranks are frozen for each
            --stall-ms length, then resumed; counts the runs where a round
            ended for a node loss (which stall length is taken for a loss).
  etcdstall ft-launcher only, not in the default: 2 nodes (--nnodes 2); the
            job's etcd is frozen (SIGSTOP) for each --etcd-stall-s length, then
            resumed: Debian's etcd (external) or the embedded etcd's host
            (node 0's launcher and its ft-launcher-etcd), or (leader) the Raft
            leader of 3 embedded members on 3 nodes, alone. Cost = time from
            etcd's return to rank 0's ready stamp of the new round, 0 when no
            round ended within lease_ttl + 8 s (the ranks trained through).
  soak      not in the default: the no-false-alarm load test, 8 launchers
            (--nnodes 8) with heartbeating ranks for --soak-seconds while
            one busy loop per CPU saturates the machine; counts the node
            losses declared (must be 0) and the rounds ended.
A round not complete within --bound seconds is recorded as "no restart within
bound". Prints markdown on stdout; progress and failures on stderr.

One file on purpose: every scenario shares the same node harness (start N
launchers on loopback, stamp and parse the ranks' starts, kill or stop a
node), and a scenario is a short function over it.

usage: multinode.py [--bin-dir DIR] [--torchrun CMD] [--reps N] [--nproc N]
                    [--bound S] [--only nodeloss,crash] [--torchrun-tuned]
                    [--keep DIR]
"""
import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bench import DEFAULT_TORCHRUN, descendants, ms, pct, progress, read_lines

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "mn_worker.py")
NODES = 4
# The one c10d setting torch 1.13 lets us shorten on this path: the last call
# (30 s by default). Its keep-alive (5 s x 3 = 15 s to drop a dead node) is
# hard-coded in 1.13 (dynamic_rendezvous.py), not an --rdzv_conf key.
TUNED_CONF = "last_call_timeout=1"


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_time(pid):
    """Kernel start time of pid (field 22 of /proc/pid/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class Launcher:
    """How one launcher spells a node's command line."""

    def __init__(self, name, kind, argv, rdzv_conf=""):
        self.name, self.kind, self.argv, self.rdzv_conf = name, kind, argv, rdzv_conf

    def cmd(self, node, endpoint, run_id, nnodes, nproc, log_dir, worker_args, extra=(), backend="c10d"):
        if self.kind == "ft":
            conf = ["--rdzv-conf", self.rdzv_conf] if self.rdzv_conf else []
            return self.argv + list(extra) + [
                "--local-addr", f"127.0.0.{2 + node}", "--rdzv-backend", backend,
                "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, *conf,
                "--nnodes", nnodes, "--nproc-per-node", str(nproc),
                "--max-restarts", "3", "--monitor-interval", "0.1",
                # The stand-in worker's rank 0 listens on MASTER_PORT itself
                # (like torch 1.13's rank-0 store): the port must be free.
                "--agent-store", "off",
                "--log-dir", log_dir, "--no-python", WORKER, *worker_args]
        conf = f"is_host={1 if node == 0 else 0}" + (f",{self.rdzv_conf}" if self.rdzv_conf else "")
        return self.argv + [
            "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id,
            "--rdzv_conf", conf, "--nnodes", nnodes, "--nproc_per_node", str(nproc),
            "--max_restarts", "3", "--monitor_interval", "0.1",
            "--log_dir", log_dir, "--no_python", WORKER, *worker_args]


class Cluster:
    """NODES launchers of one job, each in its own session; stop() leaves nothing."""

    def __init__(self, launcher, workdir, tag, nnodes, nproc, mode, crash=(), extra=(), endpoint=None, nodes=NODES,
                 backend="c10d"):
        self.dir = os.path.join(workdir, tag)
        os.makedirs(self.dir)
        self.stamps = os.path.join(self.dir, "stamps")
        endpoint = endpoint or f"127.0.0.2:{free_port('127.0.0.2')}"
        run_id = f"mnbench-{tag}-{time.time_ns()}"
        self.procs, self.logs, self.known = [], [], {}  # known: pid -> start time
        self.n = nodes
        for node in range(nodes):
            ndir = os.path.join(self.dir, f"node{node}")
            tmp = os.path.join(ndir, "tmp")  # etcd data dir and torch temp files
            os.makedirs(tmp)
            # TMPDIR inside workdir: a SIGKILLed node's etcd data dir is removed too.
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=tmp)
            cmd = launcher.cmd(node, endpoint, run_id, nnodes, nproc, os.path.join(ndir, "logs"),
                               [self.stamps, str(node), mode, *crash],
                               [x.replace("{node_dir}", ndir) for x in extra], backend)
            log = open(os.path.join(ndir, "launcher.log"), "wb")
            self.logs.append(log)
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True)
            self.procs.append(p)
            self.remember([p.pid])

    def remember(self, pids):
        for pid in pids:
            st = start_time(pid)
            if st is not None:
                self.known.setdefault(pid, st)

    def node_pids(self, node):
        """The launcher of node and every live process below it."""
        root = self.procs[node].pid
        return [root] + descendants(root)

    def refresh(self):
        for n in range(self.n):
            self.remember(self.node_pids(n))
        self.remember(int(f[7]) for f in read_lines(self.stamps) if f[1] == "start")

    def signal_node(self, node, sig):
        """Send sig to the node's launcher and all its processes at once; returns the time."""
        pids = self.node_pids(node)
        pids += [int(f[7]) for f in read_lines(self.stamps)
                 if f[1] == "start" and f[2] == str(node) and int(f[7]) not in pids]
        self.remember(pids)
        t = time.time_ns()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return t

    def power_off(self, node):
        """SIGKILL the node's launcher and all its processes at once; returns the kill time."""
        return self.signal_node(node, signal.SIGKILL)

    def freeze(self, node):
        """SIGSTOP the node's launcher and all its processes (a silent node); returns the time."""
        return self.signal_node(node, signal.SIGSTOP)

    def lines(self):
        return read_lines(self.stamps)

    def tail(self, node, n=8):
        with open(os.path.join(self.dir, f"node{node}", "launcher.log"), "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")

    def stop(self):
        """SIGTERM every launcher, then SIGKILL whatever of this job is left."""
        self.refresh()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.refresh()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, st in self.known.items():
            if start_time(pid) == st:  # same process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        for log in self.logs:
            log.close()


def parse(lines):
    """start stamps grouped by round (MASTER addr:port), plus ready/crash stamps."""
    rounds, ready, crash = {}, {}, []
    for f in lines:
        if f[1] == "start":
            rounds.setdefault(f[6], []).append((int(f[0]), int(f[2]), int(f[3]), int(f[5])))
        elif f[1] == "ready":
            ready[f[6]] = int(f[0])
        elif f[1] == "crash":
            crash.append(int(f[0]))
    return rounds, ready, crash


def complete_round(lines, world, after_ns):
    """The first round (by its last start) whose world-size ranks all started after after_ns."""
    rounds, ready, _ = parse(lines)
    best = None
    for master, starts in rounds.items():
        starts = [s for s in starts if s[0] > after_ns and s[3] == world]
        ranks = {s[2] for s in starts}
        if ranks == set(range(world)):
            first = {}
            for t, node, rank, _ in sorted(starts):
                first.setdefault(rank, (t, node))
            last = max(t for t, _ in first.values())
            if best is None or last < best[0]:
                best = (last, ready.get(master), sorted({n for _, n in first.values()}), master)
    return best


def wait_for(cluster, cond, bound, what):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        r = cond()
        if r:
            return r
        if all(p.poll() is not None for p in cluster.procs):
            break
        time.sleep(0.05)
    return None


def round0_ready(cluster, world):
    rounds, ready, _ = parse(cluster.lines())
    for master, starts in rounds.items():
        if master in ready and len({s[2] for s in starts if s[3] == world}) == world:
            rank0_node = next(s[1] for s in starts if s[2] == 0)
            return master, sorted({s[1] for s in starts}), rank0_node
    return None


class NoRestart(Exception):
    """The job was not running again within the bound (a result, not a harness failure)."""


def nodeloss_once(launcher, nproc, bound, workdir, tag):
    # torchrun: all 4 nodes active (world 4n) -> 3 after the loss.
    # ft-launcher: 3 active + 1 standby (world 3n) -> 3 (standby promoted).
    w0 = (NODES if launcher.kind == "torchrun" else NODES - 1) * nproc
    w1 = (NODES - 1) * nproc
    c = Cluster(launcher, workdir, tag, f"{NODES - 1}:{NODES}", nproc, "poweroff")
    try:
        r0 = wait_for(c, lambda: round0_ready(c, w0), 120, "round 0")
        if not r0:
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        time.sleep(1.0)  # steady state: collectives running
        # Not the rendezvous host (node 0) and not the node of global rank 0.
        active = [n for n in r0[1] if n not in (0, r0[2])]
        victim = 1 if 1 in active else active[0]
        t_kill = c.power_off(victim)
        res = wait_for(c, lambda: complete_round(c.lines(), w1, t_kill), bound, "next round")
        if not res:
            exits = [p.poll() for p in c.procs]
            raise NoRestart(f"no complete {w1}-rank round within {bound:.0f} s after the kill "
                            f"(launcher exit codes {exits})")
        last, rdy, nodes, _ = res
        if victim in nodes:
            raise RuntimeError(f"killed node {victim} ran in the next round")
        if rdy is None:  # give rank 0 a moment to see every peer
            rdy = wait_for(c, lambda: parse(c.lines())[1].get(res[3]), 10, "ready")
        return last - t_kill, (rdy - t_kill) if rdy else None
    finally:
        c.stop()


def crash_once(launcher, nproc, bound, workdir, tag):
    world = NODES * nproc
    c = Cluster(launcher, workdir, tag, str(NODES), nproc, "crash", crash=("1", "0", "1.0"))
    try:
        if not wait_for(c, lambda: round0_ready(c, world), 120, "round 0"):
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        crash = wait_for(c, lambda: parse(c.lines())[2], 30, "crash")
        if not crash:
            raise RuntimeError("the injected crash never happened")
        t_crash = crash[0]
        res = wait_for(c, lambda: complete_round(c.lines(), world, t_crash), bound, "next round")
        if not res:
            raise NoRestart(f"no complete {world}-rank round within {bound:.0f} s after the crash")
        last, rdy, _, master = res
        if rdy is None:
            rdy = wait_for(c, lambda: parse(c.lines())[1].get(master), 10, "ready")
        return last - t_crash, (rdy - t_crash) if rdy else None
    finally:
        c.stop()


SWAP_VARIANTS = {
    "no filler": dict(filler=False, members=False),
    "filler": dict(filler=True, members=False),
    "etcd member": dict(filler=True, members=True),
    "silent": dict(filler=False, members=False, freeze=True),
}
FILLER = "sleep 600 & (sleep 600 &) & setsid sleep 600 & wait"


def member_endpoints():
    """Three endpoints on nodes 0-2 whose port and port + 1 are free."""
    eps = []
    for node in range(3):
        host = f"127.0.0.{2 + node}"
        while True:
            port = free_port(host)
            try:
                with socket.socket() as s:
                    s.bind((host, port + 1))
            except OSError:
                continue
            eps.append(f"{host}:{port}")
            break
    return ",".join(eps)


def swap_event(c, node):
    """The spare_swap event of node's event log, or None."""
    import json
    path = os.path.join(c.dir, f"node{node}", "events.jsonl")
    try:
        with open(path) as f:
            for line in f:
                e = json.loads(line)
                if e.get("event") == "spare_swap":
                    return e
    except OSError:
        pass
    return None


def swap_once(launcher, nproc, bound, workdir, tag, variant):
    v = SWAP_VARIANTS[variant]
    w = (NODES - 1) * nproc
    extra = ["--event-log", "{node_dir}/events.jsonl"]
    if v["filler"]:
        extra += ["--spare-filler", FILLER]
    endpoint = member_endpoints() if v["members"] else None
    c = Cluster(launcher, workdir, tag, f"{NODES - 1}:{NODES}", nproc, "poweroff", extra=extra, endpoint=endpoint)
    try:
        r0 = wait_for(c, lambda: round0_ready(c, w), 120, "round 0")
        if not r0:
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        time.sleep(1.0)
        spare = next(n for n in range(NODES) if n not in r0[1])
        # Node 1: active, not the etcd host (node 0), and a member host in
        # the "etcd member" variant.
        victim = 1 if 1 in r0[1] and r0[2] != 1 else next(n for n in r0[1] if n not in (0, r0[2]))
        t_kill = c.freeze(victim) if v.get("freeze") else c.power_off(victim)
        res = wait_for(c, lambda: complete_round(c.lines(), w, t_kill), bound, "next round")
        if v.get("freeze"):
            c.power_off(victim)  # a frozen node would hold stop() up
        if not res:
            raise NoRestart(f"no complete {w}-rank round within {bound:.0f} s after the kill")
        last, _, nodes, _ = res
        if spare not in nodes:
            raise RuntimeError(f"the spare {spare} did not run in the next round {nodes}")
        ev = wait_for(c, lambda: swap_event(c, spare), 10, "swap event")
        if not ev:
            raise RuntimeError("the promoted spare recorded no spare_swap event")
        total = last - t_kill
        opened = ev.get("total_ms")
        detect = total / 1e6 - opened if opened is not None else None
        return total, {"detect": detect, "detector": ev.get("detection_ms"), "rendezvous": ev.get("rendezvous_ms"),
                       "filler_reclaim": ev.get("filler_reclaim_ms"), "spawn": ev.get("spawn_ms")}
    finally:
        c.stop()


def stall_once(launcher, nproc, stall_ms, workdir, tag):
    """Freeze node 1's launcher and ranks (SIGSTOP) for stall_ms, resume
    them, wait 3 s: True when a round ended for a node loss (the stall was
    taken for one; a stall over the workers' 1 s silence also fails ranks,
    which is not counted)."""
    import json
    world = NODES * nproc
    extra = ["--event-log", "{node_dir}/events.jsonl"]
    c = Cluster(launcher, workdir, tag, str(NODES), nproc, "poweroff", extra=extra)
    try:
        if not wait_for(c, lambda: round0_ready(c, world), 120, "round 0"):
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        time.sleep(1.0)
        c.freeze(1)
        time.sleep(stall_ms / 1000)
        c.signal_node(1, signal.SIGCONT)
        time.sleep(3.0)
        for node in range(NODES):
            try:
                with open(os.path.join(c.dir, f"node{node}", "events.jsonl")) as f:
                    if any(json.loads(l).get("event") == "round_ended" and "lost" in str(json.loads(l).get("reason"))
                           for l in f):
                        return True
            except OSError:
                pass
        return False
    finally:
        c.stop()


ETCDSTALL_NODES = 2


def etcdstall_once(launcher, nproc, stall_s, workdir, tag, where, ttl):
    import json
    import urllib.request
    """Stall the job's etcd for stall_s seconds (SIGSTOP, then SIGCONT) while
    ETCDSTALL_NODES nodes train, with --rdzv-conf lease_ttl=ttl. where:
    "external": Debian's etcd on 127.0.0.1 (--rdzv-backend etcd); "host": the
    embedded etcd's host, node 0's launcher and its ft-launcher-etcd (ranks
    and fence watchdog run on); "leader": 3 nodes hosting 3 embedded members,
    the Raft leader's ft-launcher-etcd alone. Returns (cost_ns, restarted): the time from
    etcd's return to training again (rank 0's ready stamp of the first round
    started after the stall began), or 0 when no round ended and no rank
    failed (the ranks trained through it)."""
    nodes = 3 if where == "leader" else ETCDSTALL_NODES
    world = nodes * nproc
    etcd, endpoint, backend = None, None, "c10d"
    if where == "leader":
        endpoint = member_endpoints()
    if where == "external":
        client, peer = f"127.0.0.1:{free_port('127.0.0.1')}", f"http://127.0.0.1:{free_port('127.0.0.1')}"
        edir = os.path.join(workdir, tag + "-etcd")
        etcd = subprocess.Popen(["/usr/bin/etcd", "--name", "b", "--data-dir", edir,
                                 "--listen-client-urls", "http://" + client, "--advertise-client-urls", "http://" + client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", "b=" + peer, "--log-level", "error"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        endpoint, backend = client, "etcd"
    conf = ",".join(x for x in (launcher.rdzv_conf, f"lease_ttl={ttl}") if x)
    l = Launcher(launcher.name, launcher.kind, launcher.argv, conf)
    c = None
    try:
        c = Cluster(l, workdir, tag, str(nodes), nproc, "poweroff", endpoint=endpoint,
                    nodes=nodes, backend=backend)
        if not wait_for(c, lambda: round0_ready(c, world), 120, "round 0"):
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        time.sleep(2.0)  # a few renewals: the fence watchdogs are armed
        r0 = [int(f[7]) for f in c.lines() if f[1] == "start" and int(f[4]) == 0]
        c.remember(r0)

        def members_of(node):
            out = []
            for pid in descendants(c.procs[node].pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[0].endswith(b"ft-launcher-etcd"):
                            out.append(pid)
                except OSError:
                    pass
            if len(out) != 1:
                raise RuntimeError(f"node {node} runs etcd members {out}, want one")
            return out
        if etcd:
            frozen = [etcd.pid]
        elif where == "leader":
            # Only the Raft leader's member stalls (a long fsync): the
            # others elect a new leader; launchers and ranks run on.
            leader = None
            for node, ep in enumerate(endpoint.split(",")):
                st = json.loads(urllib.request.urlopen(urllib.request.Request(
                    f"http://{ep}/v3/maintenance/status", data=b"{}", method="POST"), timeout=5).read())
                if st["header"]["member_id"] == st["leader"]:
                    leader = node
            if leader is None:
                raise RuntimeError("no member says it is the leader")
            frozen = members_of(leader)
        else:
            frozen = [c.procs[0].pid] + members_of(0)
        began = time.time_ns()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(stall_s)
        back = time.time_ns()
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)

        def again():
            for f in c.lines():
                if f[1] == "ready" and int(f[0]) > began and int(f[4]) >= 1:
                    return int(f[0])
            return None
        # Free: no new round within TTL + 8 s of etcd's return and every
        # round-0 rank still the same live process (a fenced rank is
        # SIGKILLed without a word: its absence is the evidence).
        t = wait_for(c, again, ttl + 8, "a new round")
        if t:
            return t - back, True
        def running(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return fields[0] not in "ZX" and int(fields[19]) == c.known.get(pid)
            except (OSError, IndexError, ValueError):
                return False
        if len(r0) == world and all(running(pid) for pid in r0) and \
                not any(f[1] == "lost" for f in c.lines()):
            return 0, False
        t = wait_for(c, again, 120, "a new round")
        if not t:
            raise NoRestart(f"not training again within 120 s of etcd's return:\n{c.tail(0)}\n{c.tail(1)}")
        return t - back, True
    finally:
        if c:
            c.stop()
        if etcd:
            etcd.kill()
            etcd.wait()


SOAK_NODES = 8


def soak(launcher, nproc, seconds, workdir):
    """No false alarm: SOAK_NODES launchers (--nnodes SOAK_NODES) with
    heartbeating ranks for `seconds` while one busy loop per CPU saturates
    the machine. Returns (node losses declared, rounds ended, load samples)."""
    import json
    extra = ["--event-log", "{node_dir}/events.jsonl"]
    c = Cluster(launcher, workdir, "soak", str(SOAK_NODES), nproc, "poweroff", extra=extra, nodes=SOAK_NODES)
    burners = []
    try:
        if not wait_for(c, lambda: round0_ready(c, SOAK_NODES * nproc), 180, "round 0"):
            raise RuntimeError(f"round 0 never ready:\n{c.tail(0)}")
        for _ in range(os.cpu_count() or 1):
            burners.append(subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]))
        loads, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(30, max(0.1, end - time.monotonic())))
            loads.append(loadavg())
            progress(f"soak: {seconds - max(0, end - time.monotonic()):.0f}/{seconds:.0f} s, load {loads[-1]}")
    finally:
        for b in burners:
            b.kill()
            b.wait()
        c.stop()
    lost, ended = set(), set()
    for node in range(SOAK_NODES):
        try:
            with open(os.path.join(c.dir, f"node{node}", "events.jsonl")) as f:
                for line in f:
                    e = json.loads(line)
                    if e.get("event") == "round_ended":
                        ended.add(e.get("round"))
                        if "lost" in str(e.get("reason", "")):
                            lost.add((e.get("round"), str(e.get("reason"))))
        except OSError:
            pass
    return lost, ended, loads


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    p = argparse.ArgumentParser(description="multi-node ft-launcher vs torchrun benchmarks")
    p.add_argument("--bin-dir", default=os.environ.get("FT_LAUNCHER_DIR", "/tmp/ftl-mn"),
                   help="directory with ft-launcher (and any companion binaries): "
                        "go build -o DIR/ ./cmd/...")
    p.add_argument("--torchrun", default=os.environ.get("TORCHRUN", DEFAULT_TORCHRUN))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--bound", type=float, default=120.0)
    p.add_argument("--only", default="nodeloss,crash",
                   help="comma list of nodeloss, crash, swap, stall, etcdstall, soak (soak: the no-false-alarm load test, not in the default)")
    p.add_argument("--soak-seconds", type=float, default=300.0, help="length of the soak test")
    p.add_argument("--stall-ms", default="300,500,700,900,1200,2000",
                   help="stall scenario: comma list of SIGSTOP lengths in ms (each --reps times)")
    p.add_argument("--etcd-stall-s", default="1,2,4,8,30",
                   help="etcdstall scenario: comma list of etcd stall lengths in s (each --reps times)")
    p.add_argument("--etcd-stall-where", default="external,host",
                   help="etcdstall scenario: external (Debian's etcd SIGSTOPped), host (the embedded etcd's host frozen), "
                        "leader (the leader of 3 embedded members SIGSTOPped)")
    p.add_argument("--etcd-stall-ttl", default="5",
                   help="etcdstall scenario: comma list of lease_ttl values")
    p.add_argument("--torchrun-tuned", action="store_true",
                   help=f"also run torchrun with --rdzv_conf {TUNED_CONF}")
    p.add_argument("--keep", help="keep stamps and launcher logs in this new directory")
    p.add_argument("--ft-rdzv-conf", default="",
                   help="--rdzv-conf for ft-launcher, e.g. gossip_probe_interval=0.5,gossip_suspicion_mult=4 "
                        "(compares gossip timings; docs/rendezvous.md)")
    p.add_argument("--variants", default=",".join(SWAP_VARIANTS),
                   help="comma list of swap variants: " + ", ".join(SWAP_VARIANTS))
    a = p.parse_args()

    launchers = []
    ftl = os.path.join(a.bin_dir, "ft-launcher")
    if os.access(ftl, os.X_OK):
        launchers.append(Launcher("ft-launcher", "ft", [ftl], a.ft_rdzv_conf))
    else:
        progress(f"no ft-launcher in {a.bin_dir!r}: measuring torchrun only")
    if a.torchrun:
        launchers.append(Launcher("torchrun", "torchrun", shlex.split(a.torchrun)))
        if a.torchrun_tuned:
            launchers.append(Launcher("torchrun (tuned)", "torchrun", shlex.split(a.torchrun),
                                      TUNED_CONF))
    only = set(a.only.split(","))

    print(f"Host: {os.cpu_count()} CPUs, `{os.uname().release}`; {NODES} nodes on loopback, "
          f"nproc {a.nproc}; reps={a.reps}; bound {a.bound:.0f} s; "
          f"ft-launcher --rdzv-conf {a.ft_rdzv_conf or '(defaults)'}; "
          f"date {time.strftime('%Y-%m-%d %H:%M:%S')}; load before: {loadavg()}\n")
    failures = []
    if a.keep:
        os.makedirs(a.keep)
    with tempfile.TemporaryDirectory(prefix="ftbench-mn.") as tmp:
        workdir = a.keep or tmp
        def collect(scenario, fn):
            res = {l.name: [] for l in launchers}
            loads = []
            for i in range(a.reps):
                for l in launchers:
                    tag = f"{scenario}-{l.name.replace(' ', '').replace('(', '-').replace(')', '')}-{i}"
                    try:
                        v = fn(l, a.nproc, a.bound, workdir, tag)
                        res[l.name].append(v)
                        progress(f"{tag}: {ms(v[0]):.0f} ms (ready {ms(v[1]) if v[1] else float('nan'):.0f} ms)")
                    except NoRestart as e:
                        res[l.name].append(None)
                        progress(f"{tag}: {e}")
                    except Exception as e:  # report, keep measuring the rest
                        failures.append(f"{tag}: {e}")
                        progress(f"FAILED {tag}: {e}")
                loads.append(loadavg())
                progress(f"{scenario}: rep {i + 1}/{a.reps} done, load {loads[-1]}")
            return res, loads

        def table(title, res, loads):
            print(f"### {title}\n")
            print("| launcher | runs | restarted within bound | p50 | max | min | p50 to rank 0 ready |\n"
                  "|---|---:|---:|---:|---:|---:|---:|")
            for name, v in res.items():
                ok = [x for x in v if x]
                lat = [ms(x[0]) for x in ok]
                rdy = [ms(x[1]) for x in ok if x[1]]
                cols = (f"{pct(lat, .5):.0f} | {max(lat):.0f} | {min(lat):.0f}" if lat
                        else "- | - | -")
                print(f"| {name} | {len(v)} | {len(ok)} | {cols} | "
                      f"{pct(rdy, .5):.0f} |" if rdy else f"| {name} | {len(v)} | {len(ok)} | {cols} | - |")
            print(f"\nAll values in ms. Load average (1/5/15 min) after each rep: {'; '.join(loads)}\n")

        def ft_only(what):
            ft = [l for l in launchers if l.kind == "ft"]
            if not ft:
                raise SystemExit(f"{what} needs ft-launcher (--bin-dir)")
            return ft

        if "nodeloss" in only:
            res, loads = collect("nodeloss", nodeloss_once)
            table(f"Node loss (power-off) -> job running again on 3 nodes x {a.nproc} ranks", res, loads)
        if "crash" in only:
            res, loads = collect("crash", crash_once)
            table(f"Rank crash on one node -> all 4 nodes x {a.nproc} ranks running again", res, loads)
        if "swap" in only:
            ft = ft_only("swap")
            variants = [x for x in a.variants.split(",") if x]
            bad = [x for x in variants if x not in SWAP_VARIANTS]
            if bad:
                raise SystemExit(f"unknown --variants {bad}: choose from {', '.join(SWAP_VARIANTS)}")
            swaps = {name: [] for name in variants}
            loads = []
            for i in range(a.reps):
                for name in variants:
                    tag = f"swap-{name.replace(' ', '')}-{i}"
                    try:
                        v = swap_once(ft[0], a.nproc, a.bound, workdir, tag, name)
                        swaps[name].append(v)
                        progress(f"{tag}: {ms(v[0]):.0f} ms {v[1]}")
                    except NoRestart as e:
                        swaps[name].append(None)
                        progress(f"{tag}: {e}")
                    except Exception as e:
                        failures.append(f"{tag}: {e}")
                        progress(f"FAILED {tag}: {e}")
                loads.append(loadavg())
            print(f"### Spare swap: power-off of an active node -> all {3 * a.nproc} ranks of the new round exec'd "
                  f"(4 nodes, one spare)\n")
            print("| variant | runs | ok | p50 total | max total | p50 detect | p50 detector | p50 rendezvous | p50 filler reclaim | p50 spawn |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for name, v in swaps.items():
                ok = [x for x in v if x]
                tot = [ms(x[0]) for x in ok]
                ph = lambda k: pct([x[1][k] for x in ok if x[1].get(k) is not None], .5) if ok else float("nan")
                if tot:
                    print(f"| {name} | {len(v)} | {len(ok)} | {pct(tot, .5):.0f} | {max(tot):.0f} | {ph('detect'):.0f} | {ph('detector'):.1f} | "
                          f"{ph('rendezvous'):.1f} | {ph('filler_reclaim'):.1f} | {ph('spawn'):.1f} |")
                else:
                    print(f"| {name} | {len(v)} | 0 | - | - | - | - | - | - | - |")
            print(f"\nAll values in ms. Load average after each rep: {'; '.join(loads)}\n")
        if "stall" in only:
            ft = ft_only("stall")
            print(f"### Stall (SIGSTOP of node 1's launcher and ranks, then SIGCONT) -> taken for a node loss?\n")
            print("| stall | runs | a round ended |\n|---:|---:|---:|")
            for st in [int(x) for x in a.stall_ms.split(",") if x]:
                ended = 0
                for i in range(a.reps):
                    try:
                        ended += stall_once(ft[0], a.nproc, st, workdir, f"stall-{st}-{i}")
                    except Exception as e:
                        failures.append(f"stall-{st}-{i}: {e}")
                progress(f"stall {st} ms: {ended}/{a.reps} ended a round, load {loadavg()}")
                print(f"| {st} ms | {a.reps} | {ended} |")
            print(f"\nLoad average after: {loadavg()}\n")
        if "etcdstall" in only:
            ft = ft_only("etcdstall")
            print(f"### etcd stall (SIGSTOP, then SIGCONT) -> training again, {ETCDSTALL_NODES} nodes x {a.nproc} ranks "
                  f"(leader: 3 nodes)\n")
            print("| etcd | lease_ttl | stall | runs | free (no round ended) | restarted | not again within 120 s | p50 to training again | worst |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for where in [x for x in a.etcd_stall_where.split(",") if x]:
                for ttl in [int(x) for x in a.etcd_stall_ttl.split(",") if x]:
                    for st in [float(x) for x in a.etcd_stall_s.split(",") if x]:
                        costs, free, restarted = [], 0, 0
                        for i in range(a.reps):
                            tag = f"etcdstall-{where}-{ttl}-{st:g}-{i}"
                            try:
                                cost, r = etcdstall_once(ft[0], a.nproc, st, workdir, tag, where, ttl)
                                costs.append(ms(cost))
                                restarted += r
                                free += not r
                                progress(f"{tag}: {ms(cost):.0f} ms, restarted {r}")
                            except NoRestart as e:
                                costs.append(float("inf"))
                                progress(f"{tag}: {e}")
                            except Exception as e:
                                failures.append(f"{tag}: {e}")
                                progress(f"FAILED {tag}: {e}")
                        ok = [x for x in costs if x != float("inf")]
                        cols = f"{pct(ok, .5):.0f} | {max(ok):.0f}" if ok else "- | -"
                        print(f"| {where} | {ttl} s | {st:g} s | {len(costs)} | {free} | {restarted} | "
                              f"{len(costs) - len(ok)} | {cols} |")
            print(f"\nms from etcd's return (SIGCONT) to rank 0's ready stamp of the new round (0: no round ended). "
                  f"Load average after: {loadavg()}\n")
        if "soak" in only:
            ft = ft_only("soak")
            lost, ended, loads = soak(ft[0], a.nproc, a.soak_seconds, workdir)
            print(f"### No false alarm: {SOAK_NODES} launchers x {a.nproc} heartbeating ranks, "
                  f"{a.soak_seconds:.0f} s, {os.cpu_count()} busy loops saturating the CPUs\n")
            print(f"- node losses declared: {len(lost)}{' ' + repr(sorted(lost)) if lost else ''}")
            print(f"- rounds ended (any cause): {len(ended)}")
            print(f"- load average during the test: {'; '.join(loads)}\n")
            if lost:
                failures.append(f"soak: {len(lost)} false node loss(es)")
    if failures:
        print("Failures:\n")
        for f in failures:
            print(f"- {f.splitlines()[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
