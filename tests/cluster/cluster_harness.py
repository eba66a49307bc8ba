"""Process-level helpers for stragglerd replicas on etcd (issue 30,
docs/cluster.md): a real etcd (Debian's etcd-server) on loopback with its
data dir in the build tree, stragglerd replicas started as processes with
--etcd-endpoints, and reads of the cluster's keys. Used by
tests/cluster/failover_test.py and bench/cluster/failover_bench.py.

etcd is read through its JSON gateway (POST /v3/kv/range, /v3/lease/
timetolive), which etcd 3.4 serves on its client port: the tests need no
gRPC module in Python, and these reads are the test's, not stragglerd's
(stragglerd speaks gRPC to etcd).
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Daemon, TestFailure, file_tail, wait_for  # noqa: E402

PREFIX = "/stragglerd/"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(address, path, timeout=5):
    with urllib.request.urlopen("http://%s%s" % (address, path), timeout=timeout) as r:
        return r.read().decode()


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Etcd:
    """One etcd member on 127.0.0.1 with free ports and a data dir under
    `workdir`, tuned for short leases as the C++ harness is (heartbeat 50 ms,
    election 500 ms: the minimum TTL etcd grants is then 1 s). kill() and
    start() again keep the data dir and the ports (etcd restarted)."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.dir = os.path.join(workdir, "etcd")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = "127.0.0.1:%d" % self.client_port
        self.log_path = os.path.join(workdir, "etcd.log")
        self.proc = None

    def start(self, timeout=30):
        client = "http://" + self.endpoint
        peer = "http://127.0.0.1:%d" % self.peer_port
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [self.binary, "--name=test", "--data-dir=" + os.path.join(self.dir, "data"),
             "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=test=" + peer, "--heartbeat-interval=50",
             "--election-timeout=500", "--logger=zap", "--log-outputs=stderr"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise TestFailure("etcd exited with %d:\n%s" % (self.proc.returncode,
                                                               self.log_tail()))
            self.range("/ready-probe")
            return True
        wait_for("etcd to answer on " + self.endpoint, ready, timeout=timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def post(self, path, body, timeout=5):
        req = urllib.request.Request("http://%s%s" % (self.endpoint, path),
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())

    def range(self, key, prefix=False):
        """[(key, value, lease)] of `key` (or every key under it)."""
        body = {"key": b64(key)}
        if prefix:
            end = key[:-1] + chr(ord(key[-1]) + 1)
            body["range_end"] = b64(end)
        out = []
        for kv in self.post("/v3/kv/range", body).get("kvs", []):
            out.append((base64.b64decode(kv["key"]).decode(),
                        base64.b64decode(kv.get("value", "")).decode(errors="replace"),
                        int(kv.get("lease", "0"))))
        return out

    def owner(self, job):
        """The replica id owning `job`, or None."""
        kvs = self.range(PREFIX + "owners/" + job)
        return kvs[0][1] if kvs else None

    def owners(self):
        """{job: replica id} of every ownership key."""
        return {k[len(PREFIX + "owners/"):]: v for k, v, _ in
                self.range(PREFIX + "owners/", prefix=True)}

    def granted_ttl(self, replica_id):
        """The TTL etcd granted the lease of `replica_id`'s registration (s)."""
        kvs = self.range(PREFIX + "replicas/" + replica_id)
        if not kvs:
            raise TestFailure("replica '%s' is not registered in etcd" % replica_id)
        answer = self.post("/v3/lease/timetolive", {"ID": str(kvs[0][2])})
        return int(answer["grantedTTL"])

    def log_tail(self, lines=30):
        return file_tail(self.log_path, lines, "(no etcd log)")

    def remove(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Replica(Daemon):
    """A stragglerd replica joined to `etcd` with the id `rid` (the log,
    ready file and id all named after it)."""

    def __init__(self, binary, workdir, etcd, rid, extra_args=()):
        super().__init__(binary, workdir, name=rid,
                         extra_args=["--etcd-endpoints", etcd.endpoint, "--config",
                                     self._config(workdir, rid)] + list(extra_args))
        self.rid = rid

    @staticmethod
    def _config(workdir, rid):
        path = os.path.join(workdir, rid + ".yaml")
        with open(path, "w") as f:
            f.write("cluster:\n  replica_id: %s\n" % rid)
        return path

    def job(self, job):
        """GET /v1/jobs/JOB here (a dict), or None when this replica does not
        serve it."""
        try:
            return json.loads(http_get(self.http_address, "/v1/jobs/" + job))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def sigkill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def load_and_steal():
    """'load average 1/5/15 min; steal %' of this machine now (the steal
    share of CPU time over the last second, from /proc/stat), for the
    benchmarks' records."""
    def cpu():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[7] if len(fields) > 7 else 0
    t0, s0 = cpu()
    time.sleep(1.0)
    t1, s1 = cpu()
    steal = 100.0 * (s1 - s0) / max(1, t1 - t0)
    return "load average %.2f %.2f %.2f; steal %.1f%%" % (os.getloadavg() + (steal,))
