"""``--state-file``: the agent keeps what its next join presents on disk, so a restarted agent rejoins (issue 31 item
7, "agent restarts"). Pure parts and MockClock runs against the fake controller; the real processes are in
``test_credential_restart.py``."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from agent_fakes import FakeController
from test_agent_shell import ADDRS, REF, TOKEN, NoJitter, events, on_mock_clock

from provisionerd.agent.saved import MAX_BYTES, SavedSecrets, StateFile, parse
from provisionerd.agent.worker import AgentConfig, Credentials, WorkerAgent
from provisionerd.domain.errors import ConfigError


def saved_bytes(**changes: object) -> bytes:
    loaded = json.loads(Credentials(REF, TOKEN).snapshot().to_json())
    loaded.update(changes)
    return json.dumps(loaded).encode()


def test_a_snapshot_restores_credentials_that_present_the_same_secret() -> None:
    fresh = Credentials(REF, TOKEN)
    again = Credentials.restore(parse(fresh.snapshot().to_json(), "t"))
    assert again.current() == TOKEN and again.snapshot() == fresh.snapshot()
    fresh.accepted("cred-v1:" + "k" * 43)
    after = Credentials.restore(parse(fresh.snapshot().to_json(), "t"))
    assert after.current() == "cred-v1:" + "k" * 43 and after.snapshot().token is None
    # A controller that issues no credential: the proof, derived from the token the restarted agent no longer has.
    proof_only = Credentials(REF, TOKEN)
    proof_only.accepted("")
    restored = Credentials.restore(parse(proof_only.snapshot().to_json(), "t"))
    assert restored.current().startswith("rejoin-v1:") and restored.current() == proof_only.current()
    # An unanswered join with the token: the restarted agent tries the proof on a refusal, as the first one would.
    spent = Credentials(REF, TOKEN)
    spent.sent_without_answer()
    assert Credentials.restore(spent.snapshot()).refused() is True
    assert TOKEN not in repr(fresh.snapshot()) and "cred-v1" not in repr(after.snapshot())


@pytest.mark.parametrize(
    "data,problem",
    [
        (b"{", "is not JSON"),
        (b"[]", "not an agent state file"),
        (saved_bytes(version=2), "not an agent state file"),
        (saved_bytes(token=5), "'token' must be printable text"),
        (saved_bytes(instance_ref="x" * 300), "'instance_ref' must be printable"),
        (saved_bytes(use_proof="yes"), "must be true or false"),
        (saved_bytes(token=None, credential="", use_proof=False), "holds no secret"),
        (b" " * (MAX_BYTES + 1), "larger than"),
    ],
)
def test_a_state_file_that_cannot_be_used_is_refused_by_name(data: bytes, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(data, "agent state file 'x'")
    assert problem in str(refused.value) and "agent state file 'x'" in str(refused.value)
    assert TOKEN not in str(refused.value)


def test_the_state_file_is_0600_whatever_the_umask_and_an_insecure_one_is_refused(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state" / "agent.json")
    assert state.load(REF, "") is None  # no file yet
    old = os.umask(0)
    try:
        state.save(Credentials(REF, TOKEN).snapshot())
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.path.parent.stat().st_mode) == 0o700
    loaded = state.load(REF, "")
    assert loaded is not None and Credentials.restore(loaded).current() == TOKEN
    state.path.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644"):
        state.load(REF, "")
    state.path.chmod(0o600)
    link = StateFile(tmp_path / "link.json")
    link.path.symlink_to(state.path)
    with pytest.raises(ConfigError, match="symbolic link"):
        link.load(REF, "")


def test_a_state_file_of_another_machine_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateFile(tmp_path / "agent.json")
    state.save(Credentials(REF, TOKEN).snapshot())
    with caplog.at_level(logging.WARNING):
        assert state.load("c1/other", "") is None
        assert state.load("", "i-0abc") is None
    assert "written for another machine" in caplog.text and TOKEN not in caplog.text
    bound = SavedSecrets("c1/i-1", "i-0abc", None, "p", "cred-v1:x", use_proof=True)
    assert bound.belongs_to("", "i-0abc") and not bound.belongs_to("c1/i-1", "")


@on_mock_clock
async def test_a_restarted_agent_rejoins_with_the_credential_its_first_run_kept(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "agent.json")
    async with trio.open_nursery() as nursery:
        fake = FakeController(nursery, ADDRS, issue_credentials=True)
        fake.allow(REF, TOKEN)
        first = WorkerAgent(
            AgentConfig(ADDRS, REF),
            TOKEN,
            fake.connect,  # type: ignore[arg-type]
            rng=NoJitter(),
            saved=Credentials(REF, TOKEN).snapshot(),
            state=state,
        )
        run = trio.CancelScope()
        nursery.start_soon(_run_in, run, first)
        await until(lambda: first.joins == 1)
        run.cancel()  # the agent dies (its process killed): only the state file is left
        await trio.sleep(1)
        kept = state.load(REF, "")
        assert kept is not None and kept.token is None and kept.credential == fake.credentials[REF]
        second = WorkerAgent(AgentConfig(ADDRS, REF), "", fake.connect, rng=NoJitter(), saved=kept, state=state)  # type: ignore[arg-type]
        nursery.start_soon(second.run)
        await until(lambda: second.joins == 1)
        assert second.refusal == "" and second.save_failures == 0
        assert [what for _, _, what in events(fake)] == ["connect", "join:token", "connect", "join:credential"]
        nursery.cancel_scope.cancel()


async def until(condition: Callable[[], bool]) -> None:
    """Wait without letting MockClock jump: the agent saves its state in a thread, during which an idle run would
    jump virtual time past every timeout (bounded by 10 s of real time)."""
    give_up = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < give_up, "not reached in 10 s"
        await trio.lowlevel.checkpoint()


async def _run_in(scope: trio.CancelScope, agent: WorkerAgent) -> None:
    with scope:
        await agent.run()
