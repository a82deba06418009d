"""Local peers of the notification tests, on loopback ports, recording what they receive: a
webhook receiver (JSON POSTs, answered with the status a function of the body chooses) and an
SMTP sink (one record per mail, dots unstuffed). Standard library only."""

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Webhook:
    """posts: the JSON bodies in arrival order; answer(body) -> HTTP status (200 if None)."""

    def __init__(self, answer=None):
        self.posts = []
        self.answer = answer
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hook.lock:
                    hook.posts.append(body)
                    status = (hook.answer and hook.answer(body)) or 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d/notify" % self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, pred=lambda body: True):
        with self.lock:
            return [p for p in self.posts if pred(p)]


class SmtpSink:
    """mails: (envelope sender, [recipients], data) per accepted mail, data with CRLF line ends
    and the dots libcurl stuffed taken out again."""

    def __init__(self):
        self.mails = []
        self.lock = threading.Lock()
        sink = self

        class Session(socketserver.StreamRequestHandler):
            def reply(self, text):
                self.wfile.write(text.encode() + b"\r\n")

            def handle(self):
                self.reply("220 sink ESMTP")
                sender, rcpts = None, []
                for raw in self.rfile:
                    verb = raw.decode(errors="replace").rstrip("\r\n")
                    head = verb[:10].upper()
                    if head.startswith(("EHLO", "HELO")):
                        self.reply("250 sink")
                    elif head == "MAIL FROM:":
                        sender, rcpts = verb[10:].strip(), []
                        self.reply("250 sender ok")
                    elif head.startswith("RCPT TO:"):
                        rcpts.append(verb[8:].strip())
                        self.reply("250 recipient ok")
                    elif head == "DATA":
                        self.reply("354 end with a dot")
                        lines = []
                        for line in self.rfile:
                            if line == b".\r\n":
                                break
                            lines.append(line[1:] if line.startswith(b".") else line)
                        with sink.lock:
                            sink.mails.append((sender, rcpts, b"".join(lines).decode()))
                        self.reply("250 accepted")
                    elif head == "QUIT":
                        self.reply("221 bye")
                        return
                    else:
                        self.reply("250 noted")

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Session)
        self.server.daemon_threads = True
        self.url = "smtp://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, pred=lambda mail: True):
        with self.lock:
            return [m for m in self.mails if pred(m)]
