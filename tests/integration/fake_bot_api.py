"""A local HTTP server that speaks enough of the Telegram Bot API for m27's tests.

It answers ``POST /bot<TOKEN>/<method>`` the way api.telegram.org does (``{"ok": true,
"result": ...}``) for getMe, sendMessage, getUpdates, answerCallbackQuery and
editMessageText, records every call, and can be told to misbehave: answer 429 with
``retry_after``, 500, 400/403, or hold a request open (``hang``: the message counts as
delivered, but the answer waits until ``release`` is set). An
``outage`` predicate (e.g. "the fake clock is before t+600") makes every call a 500.

The real python-telegram-bot client talks to it through ``base_url=server.base_url``.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

BOT_USER = {"id": 4242, "is_bot": True, "first_name": "m27", "username": "m27_test_bot"}


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    token: str
    answered: str = "ok"


@dataclass
class Fault:
    method: str  # "*" for any
    kind: str  # "429", "500", "400", "403", "hang"
    retry_after: int = 1


@dataclass
class FakeBotApi:
    token: str
    outage: Callable[[], bool] | None = None
    calls: list[Call] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    hanging: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _update_ids: Iterator[int] = field(default_factory=lambda: itertools.count(100))
    server: ThreadingHTTPServer | None = None

    # --- life -------------------------------------------------------------------------

    def start(self) -> FakeBotApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                api._handle(self)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    # --- scripting --------------------------------------------------------------------

    def fail(self, kind: str, method: str = "*", times: int = 1, retry_after: int = 1) -> None:
        with self._lock:
            self.faults.extend(Fault(method, kind, retry_after) for _ in range(times))

    def push_message(self, chat_id: int, text: str, user_id: int | None = None) -> int:
        uid = next(self._update_ids)
        msg = {
            "message_id": next(self._ids),
            "date": int(time.time()),
            "chat": _chat(chat_id),
            "from": {"id": user_id or chat_id, "is_bot": False, "first_name": "Ann"},
            "text": text,
        }
        if text.startswith("/"):
            msg["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        with self._lock:
            self.updates.append({"update_id": uid, "message": msg})
        return uid

    def push_callback(self, chat_id: int, data: str, message_id: int) -> int:
        uid = next(self._update_ids)
        query = {
            "id": f"cq{uid}",
            "from": {"id": chat_id, "is_bot": False, "first_name": "Ann"},
            "chat_instance": "ci",
            "data": data,
            "message": {
                "message_id": message_id,
                "date": int(time.time()),
                "chat": _chat(chat_id),
                "from": BOT_USER,
                "text": "Cancel?",
            },
        }
        with self._lock:
            self.updates.append({"update_id": uid, "callback_query": query})
        return uid

    # --- reading what happened --------------------------------------------------------

    def calls_to(self, method: str, answered: str | None = "ok") -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if c.method == method and (answered is None or c.answered == answered)
            ]

    def sent(self, chat_id: int | None = None) -> list[str]:
        """Texts of the sendMessage calls that were answered ok, in order."""
        return [
            c.params["text"]
            for c in self.calls_to("sendMessage")
            if chat_id is None or int(c.params["chat_id"]) == chat_id
        ]

    # --- serving ----------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if len(parts) != 2 or not parts[0].startswith("bot"):
            _reply(req, 404, {"ok": False, "error_code": 404, "description": "Not Found"})
            return
        token, method = parts[0][3:], parts[1]
        params = _params(req)
        call = Call(method, params, token)
        with self._lock:
            self.calls.append(call)
        if token != self.token:
            call.answered = "401"
            _reply(req, 401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
            return
        if self.outage is not None and self.outage():
            call.answered = "outage"
            _reply(req, 502, {"ok": False, "error_code": 502, "description": "Bad Gateway"})
            return
        fault = self._take_fault(method)
        if fault is not None and fault.kind == "hang":
            # Received (so, for the worst case, delivered); the answer comes only later.
            self.hanging.set()
            self.release.wait(60)
        elif fault is not None:
            call.answered = fault.kind
            self._misbehave(req, fault)
            return
        _reply(req, 200, {"ok": True, "result": self._result(method, params)})

    def _take_fault(self, method: str) -> Fault | None:
        with self._lock:
            for i, f in enumerate(self.faults):
                if f.method in ("*", method):
                    return self.faults.pop(i)
        return None

    def _misbehave(self, req: BaseHTTPRequestHandler, fault: Fault) -> None:
        if fault.kind == "429":
            body = {
                "ok": False,
                "error_code": 429,
                "description": f"Too Many Requests: retry after {fault.retry_after}",
                "parameters": {"retry_after": fault.retry_after},
            }
            _reply(req, 429, body)
        else:
            code = int(fault.kind)
            desc = {400: "Bad Request: chat not found", 403: "Forbidden: bot was blocked"}
            _reply(
                req,
                code,
                {
                    "ok": False,
                    "error_code": code,
                    "description": desc.get(code, "Internal Server Error"),
                },
            )

    def _result(self, method: str, params: dict[str, Any]) -> Any:
        if method == "getMe":
            return BOT_USER
        if method in ("sendMessage", "editMessageText"):
            chat_id = int(params["chat_id"])
            mid = int(params.get("message_id") or next(self._ids))
            return {
                "message_id": mid,
                "date": int(time.time()),
                "chat": _chat(chat_id),
                "from": BOT_USER,
                "text": params.get("text", ""),
            }
        if method == "getUpdates":
            offset = int(params.get("offset") or 0)
            deadline = time.monotonic() + min(float(params.get("timeout") or 0), 2.0)
            while True:  # a long poll: wait (briefly) for an update to arrive
                with self._lock:
                    self.updates = [u for u in self.updates if u["update_id"] >= offset]
                    if self.updates or time.monotonic() >= deadline:
                        return list(self.updates)
                time.sleep(0.02)
        if method in ("answerCallbackQuery", "deleteWebhook", "close", "logOut"):
            return True
        return True


def _chat(chat_id: int) -> dict[str, Any]:
    return {"id": chat_id, "type": "private" if chat_id > 0 else "group", "title": "lab"}


def _params(req: BaseHTTPRequestHandler) -> dict[str, Any]:
    length = int(req.headers.get("Content-Length") or 0)
    body = req.rfile.read(length) if length else b""
    ctype = req.headers.get("Content-Type", "")
    if ctype.startswith("application/json"):
        return dict(json.loads(body or b"{}"))
    if ctype.startswith("multipart/form-data"):
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
        )
        out: dict[str, Any] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            out[str(name)] = payload.decode() if isinstance(payload, bytes) else payload
        return out
    return {k: v[-1] for k, v in parse_qs(body.decode()).items()}


def _reply(req: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    try:
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)
    except OSError:  # the client went away (killed mid-request)
        pass


@contextmanager
def running(token: str, **kwargs: Any) -> Iterator[FakeBotApi]:
    api = FakeBotApi(token, **kwargs).start()
    try:
        yield api
    finally:
        api.stop()
