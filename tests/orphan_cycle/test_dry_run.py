"""The dry-run report in-process (MockClock, in-memory controller, in-memory provider): it reads both views,
makes no provider mutation (asserted on the provider's call log), takes no lease, commits nothing, and says which
view it could not read. Then the CLI's exit codes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cycle_world import OLD, tags
from rigs import clock, procs
from rigs.daemon import daemon_config, make_certs, simulated_provider
from rigs.lease_holder import holding_lease
from rigs.memory import MemoryNet, memory_config, open_memory_controller

from provisionerd.cli import main as cli
from provisionerd.cli.orphans import render
from provisionerd.config.loader import Backoff, Config, OrphanSettings
from provisionerd.config.writer import daemon_config_toml, write_daemon_config
from provisionerd.daemon.clients import ReadOnlyClient
from provisionerd.daemon.orphan_report import dry_run
from provisionerd.domain.errors import ProviderCrashed
from provisionerd.domain.model import NO_EPOCH, TAG_CLUSTER, InstanceFact, RequestIntent
from provisionerd.provider.client import PluginClient, ProviderClient, ProviderReader
from provisionerd.provider.paging import LIST_PAGE_SIZE
from provisionerd.testing.fake_provider import FakeProvider

NOW = OLD + 4000.0


def mock_run(fn, limit: float = 10_000.0):
    return clock.mock_run(fn, limit)


def provider_with_machines() -> FakeProvider:
    fake = FakeProvider("sim", launch_time=OLD)
    for n, (machine_id, machine_tags) in enumerate(
        [
            ("i-nj", tags("op-nj", **{"provisionerd:instance": "clu/op-nj/0"})),
            ("i-stray", tags("op-stray")),
            ("i-untagged", {}),
            ("i-cluster-only", {TAG_CLUSTER: "clu"}),
        ]
    ):
        fake.machines[machine_id] = {
            "machineId": machine_id,
            "name": f"host-{n}",
            "status": "running",
            "template": "small",
            "launchtime": OLD,
            "privateIpAddress": f"10.2.0.{n + 1}",
            "instanceRef": "",
            "tags": machine_tags,
        }
    return fake


FACTS = [
    RequestIntent("sim", NO_EPOCH, "op-nj", "small", 1, ("clu/op-nj/0",), ("a" * 64,)),
    InstanceFact("sim", NO_EPOCH, "op-nj", "clu/op-nj/0", "i-nj", "small", "a" * 64, launch_time=OLD),
    RequestIntent("sim", NO_EPOCH, "op-ghost", "small", 1, ("clu/op-ghost/0",), ("b" * 64,)),
    InstanceFact("sim", NO_EPOCH, "op-ghost", "clu/op-ghost/0", "i-ghost", "small", "b" * 64, launch_time=OLD),
]


@asynccontextmanager
async def with_facts(tmp_path: Path) -> AsyncIterator[tuple[MemoryNet, Config]]:
    """The in-memory controller holding ``FACTS`` (committed by a holder that gave its lease back), and a config."""
    async with open_memory_controller(tmp_path, 1) as net:
        config = memory_config(tmp_path, net.addresses)
        async with holding_lease(config, "sim", net.connect) as holder:
            await holder.commit(*FACTS)
        yield net, config


async def report_of(config: Config, net: MemoryNet, fake: FakeProvider):
    return await dry_run(
        config, clients={"sim": PluginClient(fake)}, connect=net.connect, timeout=10, wall_clock=lambda: NOW
    )


def test_dry_run_reads_both_views_and_changes_nothing(tmp_path):
    fake = provider_with_machines()
    seen = {}

    async def main():
        async with with_facts(tmp_path) as (net, config):
            facts_before = net.facts()
            report = await report_of(config, net, fake)
            seen.update(report=report, facts_before=facts_before, facts_after=net.facts(), leases=net.live_leases())

    mock_run(main)
    report = seen["report"]
    # Its call log: the listing, and whether it declares licence pools (it does not, so no listLicenses).
    assert fake.calls == [
        ("listMachines", {"tags": {TAG_CLUSTER: "clu"}, "pageSize": LIST_PAGE_SIZE}),
        ("describeProvider", {}),
    ]
    assert report.mutations == 0 and report.calls == {"sim": ("listMachines", "describeProvider")}
    assert report.unreadable == ()
    got = {(f.orphan_class, f.machine_id, f.action) for f in report.findings}
    assert got == {
        ("never_joined", "i-nj", "return"),
        ("tagged_unknown", "i-stray", "report"),
        ("ghost", "i-ghost", "retire"),
    }
    for finding in report.findings:
        assert {"no_lease", "dry_run"} <= set(finding.blocked_by)
    assert seen["facts_after"] == seen["facts_before"] and seen["leases"] == []
    document = json.loads(render(report, as_json=True))
    assert document["mutations"] == 0 and len(document["findings"]) == 3
    table = render(report, as_json=False)
    assert "never_joined" in table and "no_lease" in table and "i-untagged" not in table


def test_the_report_says_which_view_it_could_not_read(tmp_path):
    fake = provider_with_machines()
    fake.fail_next("listMachines", ProviderCrashed("sim", "listMachines", "exit status 70"))
    seen = {}

    async def main():
        async with with_facts(tmp_path) as (net, config):
            seen["no_listing"] = await report_of(config, net, fake)
            net.partitioned = True
            seen["no_view"] = await report_of(config, net, fake)

    mock_run(main)
    no_listing = seen["no_listing"]
    assert no_listing.unreadable == (
        "the listing of provider 'sim' could not be read: provider 'sim' listMachines: exit status 70",
    )
    # Without the listing only what the facts prove remains: machines with a fact and no host, blocked.
    assert [(f.orphan_class, f.machine_id) for f in no_listing.findings] == [
        ("never_joined", "i-ghost"),
        ("never_joined", "i-nj"),
    ]
    assert all("listing_unreadable" in f.blocked_by for f in no_listing.findings)
    no_view = seen["no_view"]
    assert len(no_view.unreadable) == 1 and "controller's view could not be read" in no_view.unreadable[0]
    assert "cannot reach" in no_view.unreadable[0] and no_view.findings == ()
    assert [action for action, _ in fake.calls if action != "describeProvider"] == ["listMachines", "listMachines"]


def test_the_read_only_client_has_no_mutation_to_ask_for():
    # It used to refuse mutating actions by name when asked (``call``); now it has none to ask for, typed or raw:
    # the plugin can see only reads, whoever holds the client.
    fake = FakeProvider("sim")
    guarded = ReadOnlyClient(PluginClient(fake))
    for method in ("request_machines", "request_return_machines", "stop_machines", "return_licenses", "call"):
        assert not hasattr(guarded, method)
    assert isinstance(guarded, ProviderReader) and not isinstance(guarded, ProviderClient)

    async def main():
        await guarded.list_machines({TAG_CLUSTER: "clu"})

    mock_run(main)
    assert [action for action, _ in fake.calls] == ["listMachines"]
    assert guarded.calls == ["listMachines"] and guarded.mutations == 0


def config_for(path: Path, address: str, orphans: dict | None = None, *, state: Path | None = None, certs=None):
    """Provider ``sim`` (the simulated plugin), the controller at ``address`` with a short connect timeout, TLS files
    from ``certs`` (default: a directory that does not exist), events log and admin socket in ``state``."""
    home = path.parent
    return daemon_config(
        certs or home / "certs",
        [address],
        state or home,
        simulated_provider(home, orphans=OrphanSettings(**(orphans or {}))),
        cluster="clu",
        identity="prov-1",
        link={"connect_timeout": 0.5, "backoff": Backoff(initial=0.05, max=0.2)},
    )


def write_config(path: Path, address: str, *, state: Path | None = None, certs: Path | None = None) -> Config:
    return write_daemon_config(config_for(path, address, state=state, certs=certs), path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "{config}"], "--dry-run"),
        (["--config", "{missing}", "--dry-run"], "cannot read config"),
        (["--config", "{config}", "--dry-run", "--provider", "nope"], "no provider named 'nope'"),
        (["--config", "{config}", "--dry-run", "--timeout", "0"], "--timeout"),
        (["--config", "{config}", "--dry-run"], "cannot load the TLS files"),
    ],
)
def test_bad_arguments_and_config_exit_2(tmp_path, capsys, argv, message):
    config = tmp_path / "pd.toml"
    write_config(config, "127.0.0.1:9")
    argv = [a.format(config=config, missing=tmp_path / "missing.toml") for a in argv]
    assert cli.main(["orphans", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_config_with_an_invalid_orphan_knob_exits_2(tmp_path, capsys):
    config = tmp_path / "pd.toml"
    config.write_text(daemon_config_toml(config_for(config, "127.0.0.1:9", {"ghost_confirmations": 1})))
    assert cli.main(["orphans", "--config", str(config), "--dry-run"]) == 2
    assert "ghost_confirmations" in capsys.readouterr().err


@pytest.mark.process
def test_an_unreachable_controller_exits_1_and_says_so(tmp_path):
    """Real TLS files, a controller address nobody listens on, the simulated plugin: the listing is read, the
    view is not, exit status 1."""
    config = tmp_path / "pd.toml"
    write_config(config, "127.0.0.1:9", certs=make_certs(tmp_path, "clu"))
    argv = procs.provisionerd("orphans", "--config", config, "--dry-run", "--json", "--timeout", "1")
    result = procs.run(argv)
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"findings": [], "mutations": 0}
    assert "the controller's view could not be read" in result.stderr
