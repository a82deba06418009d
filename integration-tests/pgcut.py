"""A TCP proxy in front of a PostgreSQL server that makes a transaction's outcome unknown to its
client, on demand: the moment a crash or a network cut leaves a writer not knowing whether its
COMMIT happened.

    cut = PgCut(port_of_the_server)       # listens on cut.port; point a DSN at it
    cut.arm("t_claim_ledger")             # the next COMMIT of a transaction that ran a
                                          # statement naming t_claim_ledger (given a tuple:
                                          # naming each of its strings):
                                          #   after=True (default): forwarded, the server commits,
                                          #   and the connection is cut before its answer;
                                          #   after=False: cut instead of forwarded (the server
                                          #   rolls back);
                                          #   then=cut.down: and from that moment the server
                                          #   is unreachable (any callable, run at the cut,
                                          #   while the cut connection is still held open)
    cut.wait_cut(5)                       # True once every armed cut happened
    cut.down(); cut.up()                  # every connection closed and new ones refused
                                          # (the server unreachable), and back
    cut.stop()

It reads what the client sends (the startup, then typed messages): statements are the text of
Parse ('P') and simple Query ('Q') messages; a transaction's text is what was sent since its
BEGIN, with the parameters bound to them (Bind, 'B'), so a needle may name a row's id. libpq
sends COMMIT as a simple query (pgpool_commit: PQexec). What the server sends is passed on
untouched. Standard library only."""

import socket
import struct
import threading
import time

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104


class PgCut:
    def __init__(self, upstream_port, upstream_host="127.0.0.1"):
        self.upstream = (upstream_host, int(upstream_port))
        self.lsock = None
        self.port = None
        self.lock = threading.Lock()
        self.armed = []  # [(needle, after)], the first that matches is used
        self.cut_texts = []  # [(time, text)] of the last transactions cut, for seen()
        self.cutting = 0  # taken from armed, not done yet
        self.cuts = 0
        self.conns = set()
        self.recent = []  # the last COMMITs passed on uncut: (seconds, the transaction's text)
        self.opened = []  # when the last connections were passed to the server, for seen()
        self.refusing = False
        self.stopped = False
        self._listen()

    # ---- control

    def arm(self, needle, after=True, then=None):
        """then: called at the cut, before the client learns anything (say this proxy's down,
        or another's: the servers unreachable before the client can ask them)."""
        with self.lock:
            self.armed.append((needle, after, then))

    def wait_cut(self, timeout):
        """True once every armed cut happened."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if not self.armed and not self.cutting:
                    return True
            time.sleep(0.01)
        return False

    def down(self):
        """Every connection closed; new ones are accepted and closed at once (refused as far as
        the client can tell: the server is gone). A connection being accepted at this moment is
        closed too: it registers under the same lock, or sees refusing."""
        with self.lock:
            self.refusing = True
            conns = list(self.conns)
        for c in conns:
            c.close()

    def up(self):
        self.refusing = False

    def stop(self):
        self.stopped = True
        self.down()
        try:
            self.lsock.close()
        except OSError:
            pass

    # ---- the proxy

    def _listen(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(128)
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):  # small messages, sent at once as libpq sends them
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Conn(self, client, server)

    def _take(self, text):
        """The armed cut this transaction's text matches, removed from the list, or None."""
        with self.lock:
            for i, (needle, after, then) in enumerate(self.armed):
                if all(n in text for n in ((needle,) if isinstance(needle, str) else needle)):
                    del self.armed[i]
                    self.cut_texts = (self.cut_texts + [(time.time(), text[:600])])[-4:]
                    self.cutting += 1
                    return after, then
            self.recent = (self.recent + [(time.time(), text[:300])])[-8:]
        return None

    def seen(self):
        """What this proxy saw, for a test's failure message: its connections (and when the last
        ones opened), the last COMMITs it let through and the last it cut."""
        with self.lock:
            return "%d connections (the last opened %s), armed %s, last commits: %s, cut: %s" % (
                len(self.conns), ["%.1f s ago" % (time.time() - t) for t in self.opened],
                [a[0] for a in self.armed],
                ["%.1f s ago: %r" % (time.time() - t, x) for t, x in self.recent],
                ["%.1f s ago: %r" % (time.time() - t, x) for t, x in self.cut_texts])


class _Conn:
    def __init__(self, proxy, client, server):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.cut = False
        self.closed = False
        with proxy.lock:  # checked with the registration: a down() since accept closes it
            refused = proxy.refusing
            if not refused:
                proxy.conns.add(self)
                proxy.opened = (proxy.opened + [time.time()])[-4:]
        if refused:
            self.close()
            return
        threading.Thread(target=self._from_client, daemon=True).start()
        threading.Thread(target=self._from_server, daemon=True).start()

    def close(self):
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        with self.proxy.lock:
            self.proxy.conns.discard(self)

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            part = self.client.recv(n - len(buf))
            if not part:
                raise OSError("client closed")
            buf += part
        return buf

    def _from_client(self):
        tx = []
        try:
            started = False
            while not started:  # the startup packet, after an SSL or GSS request if any
                head = self._recv(8)
                length, code = struct.unpack("!ii", head)
                body = self._recv(length - 8)
                self.server.sendall(head + body)
                started = code not in (SSL_REQUEST, GSS_REQUEST)
            while True:
                head = self._recv(5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = self._recv(length - 4)
                text = None
                if kind == b"Q":
                    text = body.split(b"\0", 1)[0].decode(errors="replace")
                elif kind == b"P":  # name\0 query\0 ...
                    parts = body.split(b"\0", 2)
                    if len(parts) > 1:
                        text = parts[1].decode(errors="replace")
                elif kind == b"B":  # its parameters, as text: what a needle may name
                    tx.append(body.decode(errors="replace"))
                if text is not None:
                    word = text.strip().upper()
                    if word.startswith("BEGIN"):
                        tx = []
                    if kind == b"Q" and word == "COMMIT":
                        how = self.proxy._take("\n".join(tx))
                        if how is not None:
                            after, then = how
                            self.cut = True  # the server's answer is never passed on
                            with self.proxy.lock:  # closed below, after the server's commit
                                self.proxy.conns.discard(self)
                            if after:
                                self.server.sendall(head + body)
                            if then:  # before the client can learn anything by any connection
                                then()
                            if after:
                                time.sleep(0.3)  # the server commits meanwhile
                            self.close()
                            with self.proxy.lock:
                                self.proxy.cuts += 1
                                self.proxy.cutting -= 1
                            return
                        tx = []
                    else:
                        tx.append(text)
                self.server.sendall(head + body)
        except OSError:
            pass
        self.close()

    def _from_server(self):
        try:
            while True:
                data = self.server.recv(65536)
                if not data or self.cut:
                    break
                self.client.sendall(data)
        except OSError:
            pass
        if not self.cut:
            self.close()
