"""A scoring service for the tests, on 127.0.0.1, started and stopped by the test that uses it."""

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server:
    """A scoring service on 127.0.0.1: reward = length of the completion, or what ``reply`` says."""

    def __init__(self):
        self.requests, self.in_flight, self.max_in_flight = [], 0, 0
        self.lock = threading.Lock()
        self.delay = 0.0  # seconds per request, or a function of the request body
        self.reply = None  # (status, body) for the next requests, consumed one by one
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    canned = server.reply.pop(0) if server.reply else None
                time.sleep(server.delay(body) if callable(server.delay) else server.delay)
                with server.lock:
                    server.in_flight -= 1
                status, text = canned or (200, json.dumps(
                    {"rewards": [float(len(s["completion"])) if s["completion"] else None for s in body["samples"]]}))
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def serving(monkeypatch):
    """A running :class:`Server`, reached past any proxy of the environment; stopped on the way out."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = Server()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def stuck_http():
    """An HTTP server on 127.0.0.1 that takes every POST and never answers (until the block ends); its host:port."""
    release = threading.Event()

    class Stuck(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the standard library's name
            release.wait(60)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        release.set()
        srv.shutdown()
