"""Slow HTTP clients and a timed probe, shared by the slowloris benchmark
(slowloris_bench.py) and its test (tests/security/slowloris_test.py).

    with Slowloris("127.0.0.1", port, clients=50, trickle_s=0.2) as attack:
        seconds, status, size = probe("127.0.0.1", port, "/healthz", timeout=5)
    attack.connections, attack.closed_by_server, attack.answers

Each slow client trickles a request's headers one byte per trickle_s (or,
with readers_path, reads a whole response slowly; with tls_stall, stalls
the TLS handshake), reconnecting as soon as the daemon closes it, as an
attacker would. Python 3 standard library only.
"""

import http.client
import socket
import ssl
import threading
import time


def client_hello(tls):
    """The bytes of a TLS ClientHello from context `tls`."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = tls.wrap_bio(incoming, outgoing, server_side=False)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


class Slowloris:
    """N threads, each keeping one trickling connection open."""

    def __init__(self, host, port, clients, trickle_s, readers_path=None, tls=None,
                 tls_stall=None, read_bytes=1):
        self.host, self.port, self.trickle_s = host, port, trickle_s
        self.readers_path = readers_path
        self.read_bytes = read_bytes
        self.tls = tls
        self.tls_stall = tls_stall
        self.stop = threading.Event()
        self.connections = 0  # opened, reconnects included
        self.closed_by_server = 0
        self.answers = []  # what the daemon said to the trickling connections it cut off
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        return False

    def run(self):
        while not self.stop.is_set():
            try:
                if self.readers_path:
                    # A small receive window, set before connect: the daemon's
                    # response stops at the socket buffers, and the reader sees
                    # the daemon's close as soon as it read the little they hold.
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    s.settimeout(5)
                    s.connect((self.host, self.port))
                else:
                    s = socket.create_connection((self.host, self.port), timeout=5)
                if self.tls_stall:
                    with self.lock:
                        self.connections += 1
                    self.stall_handshake(s)
                    continue
                if self.tls:
                    s = self.tls.wrap_socket(s)  # the handshake done, then the trickle
            except OSError:
                time.sleep(0.05)
                continue
            with self.lock:
                self.connections += 1
            try:
                if self.readers_path:
                    self.read_slowly(s)
                    continue
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                while not self.stop.wait(self.trickle_s):
                    s.sendall(b"X")
                    s.setblocking(False)
                    try:
                        answer = s.recv(4096)
                        if answer:
                            with self.lock:
                                self.answers.append(answer.decode(errors="replace"))
                        raise OSError("answered or closed")  # 408, or closed
                    except (BlockingIOError, ssl.SSLWantReadError):
                        pass
                    finally:
                        s.setblocking(True)
            except OSError:
                with self.lock:
                    self.closed_by_server += 1
            finally:
                s.close()

    def stall_handshake(self, s):
        """Nothing, or a ClientHello, then no answer until the daemon closes it."""
        try:
            if self.tls_stall == "hello":
                s.sendall(client_hello(self.tls))
            s.settimeout(self.trickle_s)
            while not self.stop.is_set():
                try:
                    if s.recv(65536) == b"":
                        break
                except socket.timeout:
                    pass
            else:
                return
        except OSError:
            pass
        finally:
            s.close()
        with self.lock:
            self.closed_by_server += 1

    def read_slowly(self, s):
        """A whole request, then its response read read_bytes per trickle."""
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % self.readers_path).encode())
        while not self.stop.wait(self.trickle_s):
            if s.recv(self.read_bytes) == b"":
                raise OSError("closed")


def probe(host, port, path, timeout, tls=None):
    """Seconds to a whole response on a fresh connection (with its TLS
    handshake), its status and size."""
    t0 = time.monotonic()
    try:
        c = (http.client.HTTPSConnection(host, port, timeout=timeout, context=tls) if tls
             else http.client.HTTPConnection(host, port, timeout=timeout))
        c.request("GET", path)
        r = c.getresponse()
        size = len(r.read())
        status = r.status
        c.close()
    except OSError as e:
        return time.monotonic() - t0, "error: %s" % e, 0
    return time.monotonic() - t0, status, size
