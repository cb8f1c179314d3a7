"""The worker agent: what runs on a machine provisionerd created, joining the cluster controller as a worker.

One ``WorkerAgent`` keeps one machine joined: it connects (through an injected ``Connector``, mutual TLS with the
``worker`` certificate in production), follows a standby's redirect to the primary, joins with its instance
reference and single-use token, reports its status (``idle`` at once, then ``idle``/``busy`` whenever
``set_status`` changes it), heartbeats, and reconnects with jittered backoff, rotating through the configured
addresses, whenever the connection breaks or goes quiet.

Every join after the first presents the credential the accepted reply carried (``JoinReply.credential``, protocol
§4) instead of the spent token; to a controller that issues none, the rejoin proof (``agent.token``). If a join with
the token got no answer (the connection broke in between), the controller may or may not have consumed it: when
the token is then refused, the agent tries the proof once (``join.Credentials``).

``run`` returns only by cancellation (the machine is being returned) and raises ``JoinRefused`` when the controller
refuses the worker for good: version mismatch or role not allowed. Any other refusal (its token or credential
refused, the primary refusing now) may mean "not yet" (issue 31 finding 4: a machine that boots before its fact is
committed; a controller that lost its store, whose admin has not decided): the agent keeps its secret in memory and
joins again after a back-off doubling from 1 s to 60 s. With an ``orphan_timeout`` it raises ``Orphaned`` once no
controller has accepted it for that long (counted from the start, so an agent that never joins stops too; a refusal
does not count as heard): a machine nothing controls any more does not live on (the CLI then exits, with code 3
when its joins were being refused, and shuts the machine down where the provider said that terminates it). Time is
trio's clock throughout, so tests drive it with ``MockClock`` over in-memory streams.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping

import attrs
import trio

from provisionerd.agent.join import (
    EXIT_ORPHANED,
    EXIT_REFUSED,
    EXIT_STOPPED,
    EXIT_TOKEN_REFUSED,
    EXIT_USAGE,
    FINAL_REFUSALS,
    REFUSED_FIRST,
    REFUSED_MAX,
    Credentials,
    Elsewhere,
    Joined,
    JoinOutcome,
    JoinRefused,
    Orphaned,
    Redirect,
    Refused,
    backoff_delay,
    judge_join_reply,
)
from provisionerd.agent.saved import SavedSecrets, StateFile
from provisionerd.domain.errors import AuthError, ConfigError, LinkDown, ProtocolError
from provisionerd.domain.model import HostStatus, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import Ack, ErrorMsg, Heartbeat, HeartbeatAck, Join, Rejected, WorkerStatus

log = logging.getLogger(__name__)

__all__ = [  # the join's pure parts live in agent.join; re-exported for callers of the agent
    "EXIT_ORPHANED",
    "EXIT_REFUSED",
    "EXIT_STOPPED",
    "EXIT_TOKEN_REFUSED",
    "EXIT_USAGE",
    "FINAL_REFUSALS",
    "AgentConfig",
    "Connector",
    "Credentials",
    "Elsewhere",
    "JoinOutcome",
    "JoinRefused",
    "Joined",
    "Orphaned",
    "Redirect",
    "Refused",
    "WorkerAgent",
    "backoff_delay",
    "judge_join_reply",
]

#: Opens a stream to ``host:port`` (TCP + TLS, handshake done). Raises ``OSError``/``trio.BrokenResourceError``
#: when the address cannot be reached, ``AuthError`` when the peer is not this cluster's controller, and
#: ``ConfigError`` when our own TLS files cannot be loaded (retried: they may appear later).
Connector = Callable[[str], Awaitable[trio.abc.Stream]]

#: Failures of one connection attempt or session: log, back off, try again.
RETRYABLE = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    ProtocolError,
    AuthError,
    ConfigError,
    LinkDown,
)


def _addresses(items: Iterable[str]) -> tuple[str, ...]:
    """A typed ``tuple``: mypy's attrs plugin cannot solve ``converter=tuple``'s type variable."""
    return tuple(items)


@attrs.frozen
class AgentConfig:
    """Seconds for the times. ``reply_timeout``: silence (no frame at all) after which the connection is
    presumed dead; ``connect_timeout``: connect, TLS handshake and the join reply together; ``orphan_timeout``:
    silence from every controller after which the agent gives up for good (``None``: never), at least
    ``reply_timeout`` so that a healthy session's gaps between acknowledgements never reach it. ``capabilities``:
    the machine's report (``agent.capabilities``), measured once at start and sent with every join (re-probes after
    the join go in ``WorkerStatus``: ``report_capabilities``)."""

    controllers: tuple[str, ...] = attrs.field(converter=_addresses)
    instance_ref: str
    identity: str = ""
    heartbeat_interval: float = 5.0
    reply_timeout: float = 15.0
    connect_timeout: float = 10.0
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    max_redirects: int = 3
    orphan_timeout: float | None = attrs.field(default=None)
    #: What this machine has (``agent.capabilities.report``), sent in every Join.
    capabilities: Mapping[str, str] = attrs.field(factory=dict)

    @orphan_timeout.validator
    def _check_orphan_timeout(self, _attribute: object, value: float | None) -> None:
        if value is not None and not value >= self.reply_timeout:
            raise ValueError(f"orphan_timeout must be at least reply_timeout ({self.reply_timeout:g}), not {value!r}")

    @controllers.validator
    def _check_controllers(self, _attribute: object, value: tuple[str, ...]) -> None:
        if not value:
            raise ValueError("an agent needs at least one controller address")


# --- the agent ---------------------------------------------------------------------------------------------------


class WorkerAgent:
    """Keeps one worker joined until cancelled. ``joins`` counts accepted joins; ``term`` is the latest seen."""

    def __init__(
        self,
        config: AgentConfig,
        token: str,
        connect: Connector,
        rng: random.Random | None = None,
        claim: str = "",
        *,
        saved: SavedSecrets | None = None,
        state: StateFile | None = None,
    ):
        """``claim``: join by the address-bound join as this machine id, ``token`` being the bootstrap secret.
        ``saved``: what a previous run of this agent kept (``token`` is then not used); ``state``: where to keep
        what the next join presents whenever it changes (``agent.saved``)."""
        self.config = config
        self._connect = connect
        self._rng = rng if rng is not None else random.Random()
        if saved is not None:
            self._credentials = Credentials.restore(saved)
        else:
            self._credentials = Credentials(config.instance_ref, token, claim=claim)
        self._state = state
        self._kept = saved
        #: Saves to ``state`` that failed (the agent goes on with its secret in memory).
        self.save_failures = 0
        self.status = HostStatus.IDLE
        #: The reclaim notices to report (``report_notice``; 0 = none).
        self.reclaim_at = 0.0
        self.rebalance_at = 0.0
        #: The latest re-probe's report that differed from the one before, and when it ran (``report_capabilities``;
        #: 0 = no re-probe has changed anything since the join's report).
        self.reprobed: Mapping[str, str] = {}
        self.probed_at = 0.0
        self._probe_gen = 0  # counts report_capabilities calls: what a session compares to send each once
        self._wake = trio.Event()
        self.joins = 0
        self.term = 0
        self.connected_to = ""
        self._last_heard = 0.0
        self._orphan_scope: trio.CancelScope | None = None
        #: The last refusal since the last accepted join ("" when none) and the refusals so far.
        self.refusal = ""
        self.refusals = 0

    def report_notice(self, reclaim_at: float, rebalance_at: float) -> None:
        """Report the machine's reclaim notices (epoch seconds, 0 = none; ``agent.imds``) now if joined, otherwise
        in the first ``WorkerStatus`` after the next join. A notice once reported stays (the later time wins)."""
        for value in (reclaim_at, rebalance_at):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a notice time is epoch seconds or 0, not {value!r}")
        self.reclaim_at = max(self.reclaim_at, reclaim_at)
        self.rebalance_at = max(self.rebalance_at, rebalance_at)
        self._wake.set()

    def report_capabilities(self, capabilities: Mapping[str, str], probed_at: float) -> None:
        """Report a re-probe's whole report (``agent.reprobe``), made at ``probed_at`` (epoch seconds), once: in the
        next ``WorkerStatus`` if joined, otherwise in the first one after the next join (and again in the first of
        every later session, since the join itself carries the join's own report; protocol §6.4 "Health after
        join")."""
        if not (math.isfinite(probed_at) and probed_at > 0):
            raise ValueError(f"a re-probe's time is epoch seconds above 0, not {probed_at!r}")
        if not capabilities:
            raise ValueError("a re-probe's report is not empty (empty means unchanged on the wire)")
        self.reprobed = dict(capabilities)
        self.probed_at = probed_at
        self._probe_gen += 1
        self._wake.set()

    def set_status(self, status: HostStatus) -> None:
        """Report ``idle`` or ``busy`` (now if joined, otherwise right after the next join)."""
        if status not in (HostStatus.IDLE, HostStatus.BUSY):
            raise ValueError(f"a worker reports idle or busy, not {status.value!r}")
        self.status = status
        self._wake.set()

    async def run(self) -> None:
        """Stay joined until cancelled. Raises ``JoinRefused`` when the controller refuses this worker, and
        ``Orphaned`` when no controller was heard for ``orphan_timeout`` seconds."""
        timeout = self.config.orphan_timeout
        self._last_heard = trio.current_time()
        if timeout is None:
            await self._keep_joined()
            return
        # One deadline, moved forward by every frame heard (``_heard``): no watchdog task, nothing to poll.
        with trio.CancelScope(deadline=self._last_heard + timeout) as scope:
            self._orphan_scope = scope
            try:
                await self._keep_joined()
            finally:
                self._orphan_scope = None
        if scope.cancelled_caught:
            orphaned = Orphaned(trio.current_time() - self._last_heard, self.refusal)
            log.error("%s (orphan timeout %g s): giving up", orphaned, timeout)
            raise orphaned

    def _heard(self) -> None:
        self._last_heard = now = trio.current_time()
        if self._orphan_scope is not None and self.config.orphan_timeout is not None:
            self._orphan_scope.deadline = now + self.config.orphan_timeout

    async def _keep_joined(self) -> None:
        addresses, cursor, attempt, refusals = self.config.controllers, 0, 0, 0
        while True:
            before = self.refusals
            lasted = await self._attempt(addresses[cursor])
            await self._keep()
            if lasted is None:
                cursor = (cursor + 1) % len(addresses)
            elif lasted >= self.config.heartbeat_interval:
                attempt = 0  # a session ran and ended (failover): start again quickly, at the same address
            if self.refusals != before:  # "not yet": the same secret again, after a longer back-off (docstring)
                delay = backoff_delay(refusals, REFUSED_FIRST, REFUSED_MAX, self._rng)
                refusals += 1
            else:
                # A session that ends as soon as it starts keeps backing off: no reconnect storm.
                delay = backoff_delay(attempt, self.config.backoff_initial, self.config.backoff_max, self._rng)
                attempt += 1
                refusals = 0 if lasted is not None else refusals
            await trio.sleep(delay)

    async def _attempt(self, address: str) -> float | None:
        """Join through ``address`` (following redirects) and serve the session: how long it lasted, or ``None``
        when no session started."""
        target = address
        for _ in range(self.config.max_redirects + 1):
            try:
                framed, outcome = await self._join(target)
            except RETRYABLE as exc:
                log.warning("join via %s failed: %s", target, _describe(exc))
                return None
            if isinstance(outcome, Joined):
                started = trio.current_time()
                await self._serve(framed, target, outcome)
                return trio.current_time() - started
            await trio.aclose_forcefully(framed.stream)
            match outcome:
                case Redirect(address=redirect):
                    log.info("redirected from %s to the primary at %s", target, redirect)
                    target = redirect
                case Refused(code=code, message=message) if code in FINAL_REFUSALS:
                    raise JoinRefused(code, message)
                case Refused(code="token_invalid") if self._credentials.refused():
                    log.warning("token refused after an unanswered join via %s; presenting the rejoin proof", target)
                case Refused(code=code, message=message):
                    self.refusal = f"{code}: {message}"[:300]
                    self.refusals += 1
                    log.warning(
                        "join via %s refused (%s); the secret is kept, trying again later", target, self.refusal
                    )
                    return None
                case Elsewhere(reason=reason):
                    log.warning("join via %s: %s", target, reason)
                    return None
        log.warning("more than %d redirects starting from %s", self.config.max_redirects, address)
        return None

    async def _join(self, address: str) -> tuple[FramedStream, JoinOutcome]:
        with trio.fail_after(self.config.connect_timeout):
            stream = await self._connect(address)
            framed = FramedStream(stream)
            try:
                credentials = self._credentials
                join = Join(
                    role=Role.WORKER,
                    identity=self.config.identity or credentials.instance_ref or credentials.claim,
                    instance_ref=credentials.instance_ref,
                    token=credentials.current(),
                    machine_id=credentials.machine_claim(),
                    capabilities=self.config.capabilities,
                )
                try:
                    await framed.send(join, 1)
                    envelope = await framed.receive()
                except BaseException:
                    self._credentials.sent_without_answer()
                    raise
                if envelope is None:
                    self._credentials.sent_without_answer()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        return framed, judge_join_reply(None if envelope is None else envelope.msg)

    async def _keep(self) -> None:
        """Save what the next join presents, when it changed and a state file is configured (in a thread: the
        write is fsynced). A failure is logged and counted; the secret stays in memory."""
        if self._state is None:
            return
        snapshot = self._credentials.snapshot()
        if snapshot == self._kept:
            return
        try:
            with trio.CancelScope(shield=True):  # a credential issued and then not kept would be lost
                await trio.to_thread.run_sync(self._state.save, snapshot)
        except OSError as exc:
            self.save_failures += 1
            log.error("cannot save %s: %s (a restart of this agent could not join again)", self._state.source, exc)
            return
        self._kept = snapshot

    async def _serve(self, framed: FramedStream, address: str, joined: Joined) -> None:
        self._credentials.accepted(joined.credential, joined.instance_ref)
        await self._keep()
        self.joins += 1
        self.refusal = ""
        self.term, self.connected_to = joined.term, address
        log.info(
            "joined via %s as %r (term %d, %s, join #%d)",
            address,
            self._credentials.instance_ref,
            joined.term,
            joined.controller_id,
            self.joins,
        )
        self._heard()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guard, self._read_loop, framed, nursery.cancel_scope)
                nursery.start_soon(self._guard, self._write_loop, framed, nursery.cancel_scope)
        finally:
            self.connected_to = ""
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(framed.stream)

    async def _guard(
        self, loop: Callable[[FramedStream], Awaitable[None]], framed: FramedStream, scope: trio.CancelScope
    ) -> None:
        try:
            await loop(framed)
        except RETRYABLE as exc:
            if not scope.cancel_called:
                log.warning("connection to the controller ended: %s", _describe(exc))
        finally:
            scope.cancel()

    async def _read_loop(self, framed: FramedStream) -> None:
        while True:
            envelope = await framed.receive()
            if envelope is None:
                raise LinkDown("the controller closed the connection")
            self._heard()
            match envelope.msg:
                case HeartbeatAck(term=term):
                    if term != self.term:
                        log.info("controller term moved from %d to %d", self.term, term)
                        self.term = term
                case Ack():
                    pass
                case Rejected(reason=reason, detail=detail):
                    log.warning("controller rejected a request (corr %d): %s %s", envelope.corr, reason, detail)
                case ErrorMsg(code=code, message=message):
                    raise LinkDown(f"controller error {code}: {message}")
                case other:
                    log.debug("ignoring %s from the controller", type(other).__name__)

    async def _write_loop(self, framed: FramedStream) -> None:
        interval, timeout = self.config.heartbeat_interval, self.config.reply_timeout
        # Every session starts by reporting, notices and the latest re-probe included; a re-probe's report goes once
        # a session (empty capabilities = unchanged since the last one sent).
        reported: tuple[HostStatus, float, float] | None = None
        probe_sent = 0  # the re-probe generation last sent on this connection
        seq, corr = 0, 1
        next_beat = trio.current_time() + interval
        while True:
            self._wake = trio.Event()  # before comparing, so a change from now on wakes the next wait
            state = (self.status, self.reclaim_at, self.rebalance_at)
            probe = self._probe_gen if self._probe_gen != probe_sent else 0
            if state != reported or probe:
                current = WorkerStatus(
                    *state,
                    capabilities=self.reprobed if probe else {},
                    probed_at=self.probed_at if probe else 0.0,
                )
                corr += 1
                with trio.fail_after(timeout):
                    await framed.send(current, corr)
                if probe:
                    probe_sent = probe
                    log.info(
                        "reported the re-probe of %.0f: %s",
                        current.probed_at,
                        " ".join(f"{k}={v}" for k, v in sorted(current.capabilities.items())),
                    )
                if state != reported and (current.reclaim_at or current.rebalance_at):
                    log.info(
                        "reported status %s, reclaim at %.0f, rebalance at %.0f",
                        current.status.value,
                        current.reclaim_at,
                        current.rebalance_at,
                    )
                elif state != reported:
                    log.info("reported status %s", current.status.value)
                reported = state
            now = trio.current_time()
            if now >= next_beat:
                if now - self._last_heard > timeout:
                    raise LinkDown(f"nothing heard from the controller for {now - self._last_heard:.1f} s")
                seq, corr = seq + 1, corr + 1
                with trio.fail_after(timeout):
                    await framed.send(Heartbeat(seq), corr)
                next_beat = now + interval
            with trio.move_on_after(max(0.0, next_beat - trio.current_time())):
                await self._wake.wait()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
