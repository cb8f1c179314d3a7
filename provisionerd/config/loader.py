"""The daemon's configuration: a TOML file, checked by a JSON Schema, structured into frozen values.

``Config.from_file(path)`` either returns a complete ``Config`` or raises ``ConfigError`` listing *every* problem
with its path (``providers[1].timeouts.request: -3 is less than or equal to the minimum of 0``). The raw document is
validated before cattrs sees it, because cattrs alone would coerce ``"5"`` or ``5.7`` into ``5``.

Relative paths are resolved against the config file's directory. Durations are float seconds. Provider ``env``
values are credentials: ``repr`` of any config value shows their names only, and no error repeats them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import cattrs

from provisionerd.config.defaults import DEFAULTS  # shared with the cross-field checks in config.problems
from provisionerd.config.problems import find_problems, without_refused
from provisionerd.domain.errors import ConfigError

#: A config file above this size is refused before parsing (bounded work on bad input).
MAX_CONFIG_BYTES = 1 << 20
#: ``[[providers]] worker_orphan_timeout``'s default, seconds (docs/fleet.md, "Choosing the timeout").
DEFAULT_WORKER_ORPHAN_TIMEOUT = 3600.0


#: Contract action name -> the key of its timeout in ``[providers.timeouts]``.
ACTION_TIMEOUT_KEYS: dict[str, str] = {
    "describeProvider": "describe",
    "getAvailableTemplates": "templates",
    "requestMachines": "request",
    "getRequestStatus": "status",
    "requestReturnMachines": "return_",
    "getReturnRequests": "return_requests",
    "listMachines": "list",
    "stopMachines": "stop",
}


def _redact_env(env: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{key!r}: '***'" for key in sorted(env)) + "}"


def _read_only(env: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(env))


@attrs.frozen
class Backoff:
    """Jittered exponential backoff: ``initial * multiplier**n`` capped at ``max``, each delay scaled by a random
    factor in ``[1 - jitter, 1]``."""

    initial: float = DEFAULTS["backoff_initial"]
    max: float = DEFAULTS["backoff_max"]
    multiplier: float = 2.0
    jitter: float = 0.5


@attrs.frozen
class ControllerSettings:
    addresses: tuple[str, ...]
    server_name: str | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    heartbeat_interval: float = DEFAULTS["heartbeat_interval"]
    heartbeat_timeout: float = DEFAULTS["heartbeat_timeout"]
    max_redirects: int = 3
    backoff: Backoff = Backoff()
    #: The silence after which the controller drops this daemon (refcontroller ``--heartbeat-timeout``), when
    #: known: ``config.proofs`` proves ``heartbeat_interval`` against it.
    peer_timeout: float | None = None


@attrs.frozen
class TlsPaths:
    ca: Path
    cert: Path
    key: Path


@attrs.frozen
class LeaseSettings:
    margin: float = 2.0
    #: The lease TTL the controller grants (refcontroller ``--lease-ttl``), when known: ``config.proofs`` proves
    #: ``margin`` against it. The lease keeper checks every real grant the same way, whatever is said here.
    controller_ttl: float | None = None


@attrs.frozen
class DaemonSettings:
    events_log: Path | None = None
    admin_socket: Path | None = None
    log_level: str = "info"
    log_format: str = "text"  # text | json (provisionerd.telemetry.logging_setup)
    #: Where the daemon keeps what it remembers of the controller (``controller.memory_file``); default: the
    #: events log's directory.
    state_dir: Path | None = None
    #: ``host:port`` of the Prometheus ``/metrics``, ``/healthz`` and ``/readyz`` listener; ``None``: no listener.
    metrics_listen: str | None = None


@attrs.frozen
class ProviderTimeouts:
    default: float = 60.0
    describe: float | None = None
    templates: float | None = None
    request: float | None = None
    status: float | None = None
    return_: float | None = None  # TOML key "return"
    return_requests: float | None = None
    list: float | None = None
    stop: float | None = None

    def for_action(self, action: str) -> float:
        """The timeout (seconds) for a contract action such as ``requestMachines``; ``default`` when unset."""
        key = ACTION_TIMEOUT_KEYS.get(action)
        value = getattr(self, key) if key else None
        return self.default if value is None else value


@attrs.frozen
class HeadroomSettings:
    """``[[providers.headroom]]``: keep ``min_idle`` machines of ``template`` joined above the demand, in ``hours``
    (``HH:MM-HH:MM`` UTC; empty: always); docs/fleet.md, ``planner.headroom``."""

    template: str
    min_idle: int
    hours: str = ""


@attrs.frozen
class OrphanSettings:
    """``[providers.orphans]``; the knobs are explained in ``provisionerd.orphans.policy``. ``interval`` (seconds
    between two orphan passes) and ``settle`` (seconds after every (re)join before any automatic action) are read
    by ``provisionerd.execution.orphan_cycle``."""

    action: str = "report"  # report | stop | terminate
    grace: float = 1800.0
    max_cleanup_per_interval: int = 10
    protect_tag: str = "provisionerd:protect"
    dry_run: bool = False
    ghost_confirmations: int = 2
    breaker_max_failures: int = 3
    breaker_max_share: float = 0.5
    breaker_min_orphans: int = 3
    interval: float = 60.0
    settle: float = 60.0


@attrs.frozen
class LegacyOptions:
    """``[providers.legacy]``: how a one-shot provider may run as an unmodified LSF resource-connector plugin.

    ``mode`` is ``"auto"`` (TOML ``"auto"``, the default: legacy when the plugin directory lacks
    ``describeProvider.sh`` or ``listMachines.sh``), ``"on"`` (TOML ``true``: always through the legacy adapter) or
    ``"off"`` (TOML ``false``: never). The other keys are the adapter's settings
    (``provisionerd.provider.legacy.wiring.legacy_settings`` checks them once more when the client is built)."""

    mode: str = "auto"
    user_data: Mapping[str, str] = attrs.field(factory=dict, converter=_read_only)
    rc_account: str = "default"
    journal: Path | None = None
    max_ops: int = 4096
    state_file: str = ""  # the layout of the plugin's own state file, read for the orphan report ("awsv2")

    def settings_table(self) -> dict[str, Any]:
        """The table ``legacy_settings`` takes (without ``mode``)."""
        table: dict[str, Any] = {
            "user_data": dict(self.user_data),
            "rc_account": self.rc_account,
            "max_ops": self.max_ops,
        }
        if self.journal is not None:
            table["journal"] = str(self.journal)
        if self.state_file:
            table["state_file"] = self.state_file
        return table


@attrs.frozen
class ProviderConfig:
    """One provider this daemon serves. ``path`` is the oneshot scripts' directory or the persistent executable;
    ``argv`` the persistent command line (one of the two). ``max_ttl == 0`` means no limit. Every limit and back-off
    here applies to this provider's machines only (``provisionerd.daemon.builder.policy_from_config``)."""

    name: str
    transport: str  # oneshot | persistent
    path: Path | None = None
    argv: tuple[str, ...] = ()
    conf_dir: Path | None = None
    data_dir: Path | None = None
    max_machines: int = 100
    step_limit: int = 10
    #: Lower first: this provider's offers are chosen before those of a higher number (planner.offers).
    priority: int = 0
    #: A template's own priority, in place of ``priority`` (``{"spot-a" = 2}``).
    template_priority: Mapping[str, int] = attrs.field(factory=dict, converter=MappingProxyType)
    #: Templates whose machines are not checked against their agent's report ("*": all; planner.health).
    unverified_templates: tuple[str, ...] = ()
    #: The most GPUs, CPUs and MiB of memory this provider's machines may have in all, counted from their templates
    #: like ``max_machines`` (``None``: no limit; planner.allocate).
    max_gpus: int | None = None
    max_ncpus: int | None = None
    max_mem_mb: int | None = None
    join_deadline: float = 900.0
    #: After every (re)join to a controller, how long machines that joined before have to rejoin it before any
    #: machine is retired for not joining or for its capabilities (planner.rejoin).
    rejoin_settle: float = 120.0
    idle_time: float = 300.0
    max_ttl: float = 0.0
    provisioning_timeout: float = 1200.0
    capacity_backoff: float = 180.0
    quota_pause: float = 900.0
    unhealthy_backoff: float = 30.0
    unhealthy_backoff_max: float = 1800.0
    timeouts: ProviderTimeouts = ProviderTimeouts()
    legacy: LegacyOptions = LegacyOptions()
    orphans: OrphanSettings = OrphanSettings()
    # A frozen config must not hand out a mutable dict of credentials.
    env: Mapping[str, str] = attrs.field(factory=dict, repr=_redact_env, converter=_read_only)
    #: Seconds without reaching any controller after which a machine's agent gives up (0: never); see
    #: docs/fleet.md. On by default (issue 34): an hour outlives a controller failover (seconds), a daemon restart
    #: and a planned controller maintenance window, and bounds what a machine nothing controls costs to an hour.
    worker_orphan_timeout: float = DEFAULT_WORKER_ORPHAN_TIMEOUT
    #: Voluntary returns (idle, max_ttl, released) per ``disruption_interval``: at most this many machines and/or
    #: this percent of the provider's live machines (``None``: no budget); see docs/fleet.md.
    disruption_budget: int | None = None
    disruption_budget_percent: float | None = None
    disruption_interval: float = 60.0
    #: A busy machine past ``max_ttl`` is asked to drain and returned when idle, or this long after the ask busy or
    #: not (``provisionerd.planner.drain``; docs/operations.md).
    drain_timeout: float = 3600.0
    #: More unhealthy machines than this (a count, or ``"N%"`` of the live ones) within ``max_unhealthy_window``
    #: stops replacement at this provider ("": never); see docs/fleet.md.
    max_unhealthy: str = ""
    max_unhealthy_window: float = 600.0
    #: Warm headroom per template (``[[providers.headroom]]``; planner.headroom).
    headroom: tuple[HeadroomSettings, ...] = ()

    @property
    def command(self) -> tuple[str, ...]:
        """The persistent provider's argv (``argv``, or ``(path,)``)."""
        return self.argv or ((str(self.path),) if self.path is not None else ())


@attrs.frozen
class CostSettings:
    """``[cost]``: the cluster's currency and an optional cap per machine-hour for every demand item without its
    own (docs/fleet.md). A cap compares like with like: offers quoted in another currency, or not per hour, are
    refused under it; the schema refuses a cap without a currency and a unit other than ``hour``."""

    currency: str = ""
    unit: str = "hour"
    max_hourly_cost: float | None = None


@attrs.frozen
class Config:
    cluster: str
    identity: str
    controller: ControllerSettings
    tls: TlsPaths
    providers: tuple[ProviderConfig, ...]
    lease: LeaseSettings = LeaseSettings()
    daemon: DaemonSettings = DaemonSettings()
    source: Path | None = attrs.field(default=None, eq=False)
    cost: CostSettings = CostSettings()

    def provider(self, name: str) -> ProviderConfig:
        for provider in self.providers:
            if provider.name == name:
                return provider
        raise KeyError(name)

    @property
    def provider_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.providers)

    @classmethod
    def from_file(cls, path: str | Path) -> Config:
        """Read, validate and structure ``path``. Raises ``ConfigError`` (with every problem) on any failure."""
        path = Path(path)
        config = cls.from_toml(_read_text(path), base_dir=path.resolve().parent, name=str(path))
        return attrs.evolve(config, source=path.resolve())

    @classmethod
    def from_toml(cls, text: str, base_dir: Path, name: str = "<config>") -> Config:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            # tomllib's message names a line and column, never the offending text.
            raise ConfigError(f"config {name!r} is not valid TOML", [f"(file): {exc}"]) from None
        return cls.from_document(doc, base_dir=base_dir, name=name)

    @classmethod
    def read_document(cls, path: str | Path) -> Any:
        """The parsed TOML document of ``path``, unchecked; ``ConfigError`` when it cannot be read or parsed."""
        path = Path(path)
        try:
            return tomllib.loads(_read_text(path))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {str(path)!r} is not valid TOML", [f"(file): {exc}"]) from None

    @classmethod
    def salvaged(cls, path: str | Path) -> tuple[Config, list[str]] | None:
        """For ``config check`` on a file with problems: the config of what its document has right (every value
        the schema refuses left out, its default in its place: ``problems.without_refused``) and the paths left
        out, so the checks after the document's still run; ``None`` when nothing runnable is left. Never run."""
        try:
            doc = cls.read_document(path)
        except ConfigError:
            return None
        kept = without_refused(doc)
        if kept is None:
            return None
        repaired, removed = kept
        try:
            config = _converter.structure(_resolve_paths(repaired, Path(path).resolve().parent), Config)
        except (cattrs.BaseValidationError, ValueError, TypeError):
            return None
        return attrs.evolve(config, source=Path(path).resolve()), removed

    @classmethod
    def from_document(cls, doc: Any, base_dir: Path, name: str = "<config>") -> Config:
        """Validate a parsed document (schema, then cross-field rules) and structure it."""
        problems = find_problems(doc)
        if problems:
            raise ConfigError(f"config {name!r} has {len(problems)} problem(s)", problems)
        try:
            return _converter.structure(_resolve_paths(doc, base_dir), Config)
        except cattrs.BaseValidationError as exc:
            # Only reachable if the schema and these classes disagree; transform_error names paths, not values.
            lines = cattrs.transform_error(exc, path="$")
            raise ConfigError(f"config {name!r} could not be structured", lines) from None


def _resolve_paths(doc: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """A copy of ``doc`` with relative file paths made absolute against ``base_dir`` and TOML keys mapped to field
    names (``return`` -> ``return_``)."""

    def resolve(value: str) -> str:
        return str((base_dir / value).resolve()) if not Path(value).is_absolute() else value

    out = dict(doc)
    out["tls"] = {key: resolve(value) for key, value in doc["tls"].items()}
    if "daemon" in doc:
        out["daemon"] = {
            key: resolve(value) if key in ("events_log", "admin_socket", "state_dir") else value
            for key, value in doc["daemon"].items()
        }
    providers = []
    for provider in doc["providers"]:
        p = dict(provider)
        for key in ("path", "conf_dir", "data_dir"):
            if key in p:
                p[key] = resolve(p[key])
        if "legacy" in p:
            legacy = dict(p["legacy"])
            if "journal" in legacy:
                legacy["journal"] = resolve(legacy["journal"])
            if "mode" in legacy:  # TOML says "auto" | true | false; one string type here
                legacy["mode"] = {True: "on", False: "off"}.get(legacy["mode"], legacy["mode"])
            p["legacy"] = legacy
        if "timeouts" in p:
            p["timeouts"] = {("return_" if k == "return" else k): v for k, v in p["timeouts"].items()}
        providers.append(p)
    out["providers"] = providers
    return out


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(Path, lambda value, _: Path(value))
    return converter


_converter = _make_converter()


def _read_text(path: Path) -> str:
    """The text of a config file: bounded (``MAX_CONFIG_BYTES``), UTF-8; ``ConfigError`` otherwise."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}", [f"(file): {exc.strerror or exc}"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {str(path)!r} is invalid", [f"(file): larger than {MAX_CONFIG_BYTES} bytes"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {str(path)!r} is invalid", [f"(file): not UTF-8 ({exc.reason})"]) from None
