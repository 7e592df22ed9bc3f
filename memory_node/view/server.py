"""`memory-view`: the robot's memory in a browser (map, search, keyframes, visits, streams).

    memory-view [--memory-dir D | --ros | --fleet-url URL] [--host H] [--port P] [--token T]

One read-only local page (static/: plain JS and SVG, nothing fetched from the network) over a
small JSON API with the services' contract:

    POST /api/search             body: what /memory/search takes (text or JSON) -> its answer
    GET  /api/streams            the streams answer
    GET  /api/track              {"ok", "frame", "points": [[t, x, y], ...]} (downsampled)
    GET  /api/keyframes          {"ok", "frame", "keyframes": [[id, t, x, y, yaw], ...], "total"}
    GET  /api/notes              {"ok", "notes": [{"id", "t", "x", "y", "text", "tags"}, ...]}
    GET  /api/occupancy          {"ok", "cell", "cells": [[x, y, hits], ...]} from lidar rows
    GET  /api/pose               {"ok", "pose": {...} | null}: the robot's pose now
    GET  /api/rows/{id}          {"ok", "result": {...one result item...}, "prev", "next"}
    GET  /api/rows/{id}/image    the keyframe (image/jpeg; ?thumb=1 a small one), 404 if none

Search and streams go through the memory client (the engine in-process on --memory-dir or
--fleet-url, or the ROS services with --ros); the rest is read from the store directory
(`StoreReader`, read-only). Errors are `{"ok": false, "error": {"code", "message"}}` with
HTTP 400 (bad_request), 401 (no or wrong token), 403 (foreign Origin), 421 (foreign Host), 404,
503. Binds 127.0.0.1 unless told otherwise; any other address needs a token
(`MEMORY_VIEW_TOKEN` or --token): `Authorization: Bearer T`, or `?token=T` once on the page,
which sets a SameSite=Strict, HttpOnly cookie and drops the token from the address.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from memory_node.agent.client import EngineClient, MemoryClient
from memory_node.agent.http_guard import (
    bearer_token,
    header,
    host_allowed,
    needs_token,
    origin_allowed,
    token_matches,
)
from memory_node.agent.source_args import (
    MEMORY_DIR_DEFAULT,
    add_memory_source_args,
    check_memory_source_args,
    fleet_memory_client,
    memory_dir_of,
    ros_memory_client,
)
from memory_node.core.parameters import split_ros_args
from memory_node.view.store_reader import NotFound, StoreReader, Window

__all__ = ["DEFAULT_PORT", "TOKEN_ENV", "ViewServer", "create_app", "main"]

# the module path also when run as `python -m` (there __name__ is "__main__")
log = logging.getLogger(__spec__.name if __spec__ is not None else __name__)

STATIC = Path(__file__).resolve().parent / "static"
TOKEN_ENV = "MEMORY_VIEW_TOKEN"
DEFAULT_PORT = 8765
COOKIE = "memory_view_session"
MAX_POINTS_DEFAULT = 3000
MAX_POINTS_LIMIT = 20000
MAX_BODY = 64 * 1024
_STATUS = {"bad_request": 400, "not_active": 503, "unavailable": 503, "internal": 500}


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None
          ) -> JSONResponse:
    return JSONResponse({"ok": False, "error": {"code": code, "message": message}},
                        status_code=status, headers=headers)


class BadParam(ValueError):
    pass


def _number(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadParam(f"'{name}' must be a number (seconds since the epoch), got "
                       f"{raw[:40]!r}") from None
    if not math.isfinite(value):
        raise BadParam(f"'{name}' must be finite")
    return value


def _window(request: Request) -> Window:
    return Window(_number(request, "after"), _number(request, "before"))


def _max_points(request: Request, default: int = MAX_POINTS_DEFAULT) -> int:
    raw = request.query_params.get("max_points")
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not 2 <= int(raw) <= MAX_POINTS_LIMIT:
        raise BadParam(f"'max_points' must be an integer from 2 to {MAX_POINTS_LIMIT}")
    return int(raw)


def _session_value(token: str) -> str:
    """What the cookie holds: derived from the token, not the token itself."""
    return hmac.new(token.encode(), b"memory-view session", hashlib.sha256).hexdigest()


class ViewGuard:
    """ASGI middleware: Host (421), Origin (403) and, with a token, the token (401)."""

    def __init__(self, app: Any, bind_host: str, token: str | None) -> None:
        self.app = app
        self.bind_host = bind_host
        self.token = token or None
        self._session = _session_value(token) if token else None

    def _cookie(self, scope: dict[str, Any]) -> str | None:
        raw = header(scope, b"cookie")
        if raw is None:
            return None
        for part in raw.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = header(scope, b"host")
        if not host_allowed(host, self.bind_host):
            await error(421, "misdirected", "this server does not answer for that Host "
                        "(a foreign name pointing here is refused: DNS rebinding)"
                        )(scope, receive, send)
            return
        if not origin_allowed(header(scope, b"origin"), host):
            await error(403, "forbidden", "requests from another origin are refused"
                        )(scope, receive, send)
            return
        if self.token is not None and self._session is not None:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                              keep_blank_values=True)
            given = [v for k, v in query if k == "token"]
            if given and token_matches(given[-1], self.token) and scope["method"] == "GET":
                # Once: the cookie from now on, and the token out of the address bar.
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                target = scope.get("path", "/") + (f"?{rest}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(COOKIE, self._session, httponly=True, samesite="strict",
                                    path="/")
                await response(scope, receive, send)
                return
            if not (token_matches(bearer_token(scope), self.token)
                    or token_matches(self._cookie(scope), self._session)):
                await error(401, "unauthorized", "missing or wrong token (Authorization: "
                            "Bearer <token>, or open the page once with ?token=<token>)",
                            {"WWW-Authenticate": 'Bearer realm="memory-view"'}
                            )(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass
class ViewBackend:
    """What the API answers from: the memory client (search, streams, pose) and the store
    directory's reader (None where the store is not on this machine's disk)."""

    client: MemoryClient
    reader: StoreReader | None
    where: str = ""

    def need_reader(self) -> StoreReader:
        if self.reader is None:
            raise LookupError(f"the track, keyframes and images are read from a memory "
                              f"directory on this machine; {self.where or 'this memory'} has "
                              "none")
        return self.reader


async def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _reader_route(backend: ViewBackend, fn: Callable[[StoreReader, Request], Any]
                  ) -> Callable[[Request], Any]:
    """An endpoint answering `fn(reader, request)` as JSON, its failures as the contract's
    errors."""
    async def endpoint(request: Request) -> Response:
        try:
            reader = backend.need_reader()
            return JSONResponse(await _blocking(fn, reader, request))
        except READER_ERRORS as exc:
            return _reader_error(exc)

    return endpoint


# What reading the store may fail with, answered as the contract's errors.
READER_ERRORS = (BadParam, NotFound, LookupError, FileNotFoundError)


def _reader_error(exc: Exception) -> Response:
    if isinstance(exc, BadParam):
        return error(400, "bad_request", str(exc))
    if isinstance(exc, NotFound):
        return error(404, "not_found", str(exc))
    return error(503, "unavailable", str(exc))


def _track(reader: StoreReader, request: Request) -> dict[str, Any]:
    window, n = _window(request), _max_points(request)
    return {"ok": True, "frame": reader.world_frame(), "points": reader.track(window, n)}


def _keyframes(reader: StoreReader, request: Request) -> dict[str, Any]:
    window, n = _window(request), _max_points(request)
    shown, total = reader.keyframes(window, n)
    return {"ok": True, "frame": reader.world_frame(), "keyframes": shown, "total": total,
            "streams": reader.image_streams()}


def _notes(reader: StoreReader, request: Request) -> dict[str, Any]:
    return {"ok": True, "notes": reader.notes(_window(request), _max_points(request, 500))}


def _occupancy(reader: StoreReader, request: Request) -> dict[str, Any]:
    return reader.occupancy()


def _row(reader: StoreReader, request: Request) -> dict[str, Any]:
    row_id = _row_id(request)
    item = reader.row(row_id)
    prev, nxt = reader.neighbours(row_id)
    return {"ok": True, "result": item, "prev": prev, "next": nxt}


class _Endpoints:
    """The endpoints that talk to the memory client, and the image."""

    def __init__(self, backend: ViewBackend) -> None:
        self.backend = backend

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def search(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY:
            return error(400, "bad_request", f"the query is longer than {MAX_BODY} bytes")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return error(400, "bad_request", "the query is not UTF-8 text")
        if not text.strip():
            return error(400, "bad_request", "empty query: give text or the JSON query")
        if text.lstrip().startswith(("{", "[")):
            try:
                json.loads(text)
            except ValueError as exc:
                return error(400, "bad_request", f"the query is not valid JSON: {exc}")
        return _answer(await _blocking(self.backend.client.search, text))

    async def streams(self, request: Request) -> Response:
        return _answer(await _blocking(self.backend.client.streams))

    async def pose(self, request: Request) -> Response:
        current = await _blocking(self.backend.client.current_pose)
        return JSONResponse({"ok": True, "pose": None if current is None
                             else current.to_dict()})

    async def image(self, request: Request) -> Response:
        try:
            reader = self.backend.need_reader()
            row_id = _row_id(request)
            thumb = request.query_params.get("thumb", "") not in ("", "0", "false")
            data = await _blocking(reader.image, row_id, thumb)
        except READER_ERRORS as exc:
            return _reader_error(exc)
        # A row's image never changes under its id: cache it for a day.
        return Response(data, media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=86400, immutable"})

    async def unknown_api(self, request: Request) -> Response:
        return error(404, "not_found", f"no such API route: {request.url.path}")


def create_app(backend: ViewBackend, *, bind_host: str = "127.0.0.1",
               token: str | None = None) -> Any:
    """The Starlette app behind its guard."""
    ep = _Endpoints(backend)
    routes = [
        Route("/", ep.page),
        Route("/api/search", ep.search, methods=["POST"]),
        Route("/api/streams", ep.streams),
        Route("/api/pose", ep.pose),
        Route("/api/track", _reader_route(backend, _track)),
        Route("/api/keyframes", _reader_route(backend, _keyframes)),
        Route("/api/notes", _reader_route(backend, _notes)),
        Route("/api/occupancy", _reader_route(backend, _occupancy)),
        Route("/api/rows/{row_id}", _reader_route(backend, _row)),
        Route("/api/rows/{row_id}/image", ep.image),
        Route("/api/{rest:path}", ep.unknown_api, methods=["GET", "POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    return ViewGuard(Starlette(routes=routes), bind_host, token)


def _row_id(request: Request) -> int:
    raw = request.path_params["row_id"]
    if not raw.isdigit() or len(raw) > 18:
        raise BadParam(f"a row id is a positive integer, got {raw[:40]!r}")
    return int(raw)


def _answer(raw: str) -> Response:
    """A service answer as it is, with the HTTP status its `ok` and error code say."""
    status = 200
    try:
        obj = json.loads(raw)
        if isinstance(obj, dict) and obj.get("ok") is not True:
            err = obj.get("error")
            code = err.get("code") if isinstance(err, dict) else None
            status = _STATUS.get(str(code), 500)
    except ValueError:
        return error(500, "internal", "memory answered something that is not JSON")
    return Response(raw, status_code=status, media_type="application/json")


class ViewServer:
    """The view served by uvicorn on a thread of this process (memory-node's `view_port`,
    tests). `port=0` takes a free port; `url` tells which once started."""

    def __init__(self, backend: ViewBackend, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        import uvicorn

        if needs_token(host) and not token:
            raise ValueError(f"serving the memory view on {host} (not a loopback address) "
                             "needs a token")
        self.backend = backend
        self.host = host
        # log_config=None: uvicorn logs through the root logger; no access log (a URL may
        # carry ?token=).
        config = uvicorn.Config(create_app(backend, bind_host=host, token=token), host=host,
                                port=port, log_config=None, access_log=False,
                                log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout_s: float = 10.0) -> ViewServer:
        self._thread = threading.Thread(target=self._server.run, name="memory-view",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(f"the memory view could not listen on {self.host}:"
                              f"{self._server.config.port}")
            if time.monotonic() > deadline:
                raise TimeoutError("the memory view did not start")
            time.sleep(0.02)
        return self

    def wait(self) -> None:
        """Until the server stops (Ctrl-C reaches the main thread between the waits)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.backend.reader is not None:
            self.backend.reader.close()


# ---- command line -----------------------------------------------------------------------

USAGE = ("memory-view [--memory-dir D | --ros | --fleet-url URL] [--host H] [--port P] "
         "[--token T] [--robot-id R] [--timeout S] [--log-level L]")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memory-view", usage=USAGE,
        description="Serve the robot memory as a local web page: the map (trajectory, "
                    "keyframes, notes, places, lidar backdrop), search, keyframes, visits and "
                    "streams; read-only, no network needed.",
        epilog="With --ros, search and streams come from the running memory server, and the "
               "track, keyframes and images from its memory directory on this machine "
               "(--memory-dir, default $AGENT_MEMORY_DIR, else ./agent_memory). ROS arguments "
               "go after --ros-args. The fleet store keeps no images: with --fleet-url the map "
               "shows search hits only.")
    add_memory_source_args(p, f"the memory directory ({MEMORY_DIR_DEFAULT}); searched "
                           "in-process unless --ros", exclusive=False)
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1; any other needs a token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 takes a free one)")
    p.add_argument("--token", default=None,
                   help=f"access token; prefer ${TOKEN_ENV} (a command line shows in ps)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


def _make_backend(args: argparse.Namespace, ros_args: list[str]) -> ViewBackend:
    if args.ros:
        directory = memory_dir_of(args)
        reader = StoreReader(directory) if (directory / "memory.db").is_file() else None
        if reader is None:
            log.warning("memory-view: no memory.db in %s: search works, the map stays empty "
                        "(give the server's --memory-dir)", directory)
        return ViewBackend(ros_memory_client(args, ros_args, "memory-view"), reader,
                           where=f"the ROS memory server ({directory})")
    if args.fleet_url is not None:
        return ViewBackend(fleet_memory_client(args), None, where="the fleet store")
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    directory = memory_dir_of(args)
    if not (directory / "memory.db").is_file():
        raise FileNotFoundError(f"no memory store at {directory} (no memory.db): give "
                                "--memory-dir, e.g. demo_out/memory after make demo")
    engine = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(directory)}))
    return ViewBackend(EngineClient(engine, close_engine=True), StoreReader(directory),
                       where=str(directory))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, ros_args = split_ros_args(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    check_memory_source_args(parser, args, ros_args)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be from 0 to 65535")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if needs_token(args.host) and not token:
        parser.error(f"--host {args.host} is not a loopback address: anyone who reaches it "
                     f"could read the robot's memory; give a token (${TOKEN_ENV}, or "
                     "--token) or bind 127.0.0.1")
    if args.token is not None:
        print(f"memory-view: warning: --token is visible to every user of this machine in ps;"
              f" set {TOKEN_ENV} in the environment instead", file=sys.stderr, flush=True)
    logging.basicConfig(stream=sys.stderr, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        backend = _make_backend(args, ros_args)
    except Exception as exc:  # noqa: BLE001 - one clear line, not a trace, for a bad setup
        log.error("memory-view: cannot open memory: %s", exc)
        return 1
    server: ViewServer | None = None
    try:
        server = ViewServer(backend, args.host, args.port, token or None).start()
        log.info("memory-view: serving %s on %s%s", backend.where or "memory", server.url,
                 " (open it once with ?token=<your token>)" if token else "")
        server.wait()
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        log.error("memory-view: %s", exc)
        return 1
    finally:
        if server is not None:
            server.stop()
        backend.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
