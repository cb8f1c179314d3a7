"""The orphan cycle inside the real ``DaemonCore`` lists nothing while its provider is unhealthy (``auth_failed``),
while the daemon is a standby (the controller refused its lease as ``held``) or while the controller's view cannot
be read (the controller unreachable); on MockClock, counting the provider's ``listMachines`` calls."""

from __future__ import annotations

import trio
import trio.testing
from cycle_world import OLD
from rigs.lease_holder import holding_lease
from rigs.memory import memory_config, memory_core, open_memory_controller, running

from provisionerd.domain.errors import rejection
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

NOW = OLD + 4000.0
ORPHANS = {"interval": 30, "settle": 5}


def listings(fake: FakeProvider) -> int:
    return sum(1 for action, _ in fake.calls if action == "listMachines")


def run_core(
    tmp_path, fake: FakeProvider, events: EventLog, *, other_holder: bool, seconds: float, unreachable: float = 0.0
) -> dict:
    """``unreachable``: seconds from the start during which no controller can be reached."""
    seen: dict = {}

    async def main():
        async with open_memory_controller(tmp_path, 1, ttl=30.0) as net:
            config = memory_config(tmp_path, net.addresses, orphans=ORPHANS)
            core = memory_core(net, config, fake, events=events, wall=lambda: NOW + trio.current_time())

            async def daemon():
                net.partitioned = unreachable > 0
                async with running(core):
                    if unreachable:
                        await trio.sleep(unreachable)
                        seen["listings_unreachable"] = listings(fake)
                        seen["skipped_unreachable"] = dict(core.orphan_cycles["sim"].skipped)
                        net.partitioned = False
                    await trio.sleep(seconds - unreachable)
                    seen["cycle"] = core.orphan_cycles["sim"]
                    seen["health"] = core.loop.provider_health()
                    seen["lease"] = core.keepers["sim"].reason

            if other_holder:
                async with holding_lease(config, "sim", net.connect, identity="the-primary-daemon"):
                    await daemon()
            else:
                await daemon()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return seen


def test_an_unhealthy_provider_is_not_listed_by_the_orphan_cycle(tmp_path):
    fake = FakeProvider("sim", launch_time=OLD)
    for _ in range(1000):  # every offer read and probe answers auth_failed for the whole run
        fake.fail_next("getAvailableTemplates", rejection("sim", "getAvailableTemplates", "auth_failed", "bad key"))
    events = EventLog(keep=100_000)
    seen = run_core(tmp_path, fake, events, other_holder=False, seconds=600.0)
    assert seen["health"]["sim"]["state"] == "unhealthy" and seen["health"]["sim"]["code"] == "auth_failed"
    cycle = seen["cycle"]
    # The first offer read fails at once (before the first orphan pass could list): 10 minutes, no listing.
    assert listings(fake) == 0
    assert cycle.passes == 0 and cycle.skipped["unhealthy"] >= 19 and cycle.last_skip == "unhealthy"
    skipped = [e for e in events.of_kind("orphan_pass") if e.get("listed") is False]
    assert skipped and all(e["skipped"]["unhealthy"].startswith("auth_failed") for e in skipped)
    assert not [e for e in events.of_kind("orphan_pass") if e.get("listed") is not False]


def test_a_healthy_provider_is_listed_every_interval(tmp_path):
    """The control: the same daemon and provider without the failures lists at each pass."""
    fake = FakeProvider("sim", launch_time=OLD)
    seen = run_core(tmp_path, fake, EventLog(keep=100_000), other_holder=False, seconds=600.0)
    assert seen["health"]["sim"]["state"] == "healthy"
    # At most the first pass, at start, may skip: trio may run it before the link is up (see the last test).
    cycle = seen["cycle"]
    assert listings(fake) >= 19 and cycle.passes >= 19
    assert cycle.skipped["view_unreadable"] == sum(cycle.skipped.values()) <= 1


def test_a_standby_daemon_does_not_list(tmp_path):
    fake = FakeProvider("sim", launch_time=OLD)
    events = EventLog(keep=100_000)
    seen = run_core(tmp_path, fake, events, other_holder=True, seconds=300.0)
    assert seen["lease"] == "denied: held"
    cycle = seen["cycle"]
    # The first pass, at start, comes before the controller's first answer to the lease request: the daemon cannot
    # know yet that it is a standby (it lists, or skips if trio runs it before the link is up). After that answer,
    # 5 minutes without a listing.
    denied = next(e["mono"] for e in events.of_kind("lease_denied") if e["reason"] == "held")
    passes = list(events.of_kind("orphan_pass"))
    listed = [e for e in passes if e.get("listed") is not False]
    assert len(listed) == cycle.passes == listings(fake) == 1 - cycle.skipped["view_unreadable"]
    assert passes[0]["mono"] <= denied and all(e["mono"] <= denied for e in listed)
    assert cycle.skipped["standby"] >= 9 and cycle.last_skip == "standby"
    standby = [e for e in passes[1:] if e.get("listed") is False]
    assert len(standby) == cycle.skipped["standby"] and all("standby" in e["skipped"] for e in standby)


def test_no_listing_while_the_controller_cannot_be_reached(tmp_path):
    """Without the controller's view a pass could tell no machine apart and would act on nothing: it lists nothing
    (at 100,000 machines a listing is about a second of CPU and 100 MB held). Once the link is up, it lists."""
    fake = FakeProvider("sim", launch_time=OLD)
    events = EventLog(keep=100_000)
    seen = run_core(tmp_path, fake, events, other_holder=False, seconds=600.0, unreachable=300.0)
    assert seen["listings_unreachable"] == 0 and seen["skipped_unreachable"]["view_unreadable"] >= 10
    skipped = [e for e in events.of_kind("orphan_pass") if e.get("listed") is False]
    total = seen["cycle"].skipped["view_unreadable"]  # one more when the pass due at 300 s runs before the link is up
    assert len(skipped) == total and total - seen["skipped_unreachable"]["view_unreadable"] <= 1
    assert all(e["skipped"]["view_unreadable"].startswith("controller link is") for e in skipped)
    joined = next(e["mono"] for e in events.of_kind("resync"))
    assert joined >= 300.0 and all(e["mono"] <= joined for e in skipped)
    # After the join: a pass each interval, each listing.
    assert listings(fake) >= 9 and seen["cycle"].passes >= 9 and seen["cycle"].last_skip is None
