"""What an operator's read awaits before the status is read: the admin socket's ``status`` awaits ``prepare`` (the
daemon's status pass, off the loop for a large view), and a metrics route may be a coroutine."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import trio

from provisionerd.daemon.admin_socket import query, request, serve_admin_socket
from provisionerd.telemetry.metrics_http import HttpServer, Response, serve_http


def test_each_status_awaits_prepare_first_and_other_commands_do_not(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "admin.sock"
    sock.parent.mkdir(mode=0o700)
    prepared: list[str] = []

    async def prepare() -> None:
        await trio.sleep(0.01)  # really awaited: a checkpoint and some time
        prepared.append("ready")

    seen = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_admin_socket(
                    sock, lambda: {"prepared": len(prepared)}, prepare=prepare, task_status=task_status
                )
            )
            run = trio.to_thread.run_sync
            seen["first"] = await run(query, sock)
            seen["second"] = await run(query, sock)
            seen["other"] = await run(request, sock, {"cmd": "nothing"})
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["first"] == {"ok": True, "status": {"prepared": 1}}
    assert seen["second"] == {"ok": True, "status": {"prepared": 2}}
    assert seen["other"]["refused"] == "unknown_command" and len(prepared) == 2


def test_a_route_may_be_a_coroutine() -> None:
    async def slow() -> Response:
        await trio.sleep(0.01)
        return Response(200, b"awaited\n")

    server = HttpServer({"/metrics": slow, "/healthz": lambda: Response(200, b"ok\n")})
    seen = {}

    def get(port: int, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.read()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_http, "127.0.0.1:0", server)
            seen["metrics"] = await trio.to_thread.run_sync(get, port, "/metrics")
            seen["healthz"] = await trio.to_thread.run_sync(get, port, "/healthz")
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen == {"metrics": b"awaited\n", "healthz": b"ok\n"} and server.served == 2
