"""A local HTTP server answering the Hugging Face hub's file protocol (HEAD and GET on
/<repo>/resolve/<revision>/<path>, with X-Repo-Commit, ETag = sha256 and X-Linked-Size), for
tests of `memory-models fetch` with HF_ENDPOINT pointing at it. `corrupt` and `truncate` name
paths whose served bytes differ from what the headers promise."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HubServer:
    def __init__(self, repo_id: str, revision: str, files: dict[str, bytes]):
        self.repo_id = repo_id
        self.revision = revision
        self.files = dict(files)
        self.corrupt: set[str] = set()
        self.truncate: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _lookup(self) -> tuple[str, bytes] | None:
                prefix = f"/{outer.repo_id}/resolve/{outer.revision}/"
                path = self.path.split("?", 1)[0]
                if not path.startswith(prefix):
                    return None
                rel = path[len(prefix):]
                data = outer.files.get(rel)
                return None if data is None else (rel, data)

            def _headers(self, rel: str, data: bytes, body: bytes) -> None:
                self.send_response(200)
                self.send_header("X-Repo-Commit", outer.revision)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()

            def _body(self, rel: str, data: bytes) -> bytes:
                if rel in outer.corrupt:
                    return bytes([data[0] ^ 0xFF]) + data[1:]
                if rel in outer.truncate:
                    return data[: len(data) // 2]
                return data

            def _not_found(self) -> None:
                self.send_response(404)
                self.send_header("X-Repo-Commit", outer.revision)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                outer.requests.append(("HEAD", self.path))
                found = self._lookup()
                if found is None:
                    return self._not_found()
                rel, data = found
                self._headers(rel, data, data)

            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(("GET", self.path))
                found = self._lookup()
                if found is None:
                    return self._not_found()
                rel, data = found
                body = self._body(rel, data)
                self._headers(rel, data, body)
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> HubServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
