"""Fixtures of the data tests."""

import http.server
import threading
from types import SimpleNamespace

import pytest


@pytest.fixture
def server(tmp_path, monkeypatch):
    """HTTP server on 127.0.0.1 serving ``root``; ``requests`` lists the paths asked for."""
    monkeypatch.setenv("no_proxy", "*")
    root = tmp_path / "served"
    root.mkdir()
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield SimpleNamespace(root=root, url=f"http://127.0.0.1:{httpd.server_port}", requests=requests)
    httpd.shutdown()
    httpd.server_close()
    thread.join()
