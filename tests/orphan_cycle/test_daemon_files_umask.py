"""The whole daemon (``DaemonCore`` against the reference controller in memory) under ``umask 000``: every
directory it creates is 0700 and every file 0600, the admin socket included (issue 16 item 5)."""

from __future__ import annotations

import os
import stat

import attrs
import trio
import trio.testing
from cycle_world import World
from rigs.memory import memory_config, memory_core, open_memory_controller, running


def test_umask_000_changes_no_mode_the_daemon_creates(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    created: dict[str, int] = {}

    async def main():
        async with open_memory_controller(tmp_path, 1) as net:
            config = memory_config(tmp_path, net.addresses)
            daemon = attrs.evolve(
                config.daemon,
                events_log=root / "log" / "pd" / "events.jsonl",
                admin_socket=root / "run" / "pd" / "admin.sock",
                state_dir=root / "state" / "pd",
            )
            core = memory_core(net, attrs.evolve(config, daemon=daemon), World().provider)
            async with running(core):
                with trio.fail_after(120):
                    while not (core.keepers["sim"].valid() and core.session.synced_for("sim")):  # noqa: ASYNC110
                        await trio.sleep(0.5)
                for path in sorted(root.rglob("*")):
                    created[str(path.relative_to(root))] = stat.S_IMODE(os.lstat(path).st_mode)
            core.events.close()

    old = os.umask(0)
    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        os.umask(old)
    assert "run/pd/admin.sock" in created and "log/pd/events.jsonl" in created, created
    assert "state/pd/controller.clu.json" in created, created
    for name, mode in created.items():
        wanted = 0o700 if (root / name).is_dir() else 0o600
        assert mode == wanted, (name, oct(mode))
