"""The conformance kit for a legacy LSF plugin: the LSF checks, through the adapter the daemon would use.

A legacy plugin is not failed for lacking our extensions: the kit says it is legacy, checks what the LSF contract
promises (templates are valid; a request reaches ``complete`` with every machine asked for; a return completes and
is confirmed by the machine's own create request; ``getReturnRequests`` answers validly; an unknown template is
refused -- only a warning when it is not: the daemon never sends an unknown template; no join token ever comes
back; every machine it asked for is given back, whatever its status) and lists, as rows of their own, the
guarantees it lacks with what the daemon does instead. Exit 0 when the LSF checks pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.errors import ProviderError, ProviderRejected
from provisionerd.provider.kit import CheckFailed, CheckResult, Kit, KitOptions
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.rules import LEGACY_FEATURES, invisible_classes, lacking_guarantees
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import PluginTransport

_DEFAULT_SETTINGS = LegacySettings()
CONF_SUBDIR = "conf"  # the level under PRO_CONF_DIR some LSF plugins (awsv2) read their files from
TEMPLATE_GLOB = "*templates.json"


async def run_legacy_kit(
    runner: OneShotProvider, options: KitOptions, settings: LegacySettings = _DEFAULT_SETTINGS
) -> list[CheckResult]:
    """Run the LSF checks against the plugin behind ``runner`` (a one-shot client of a legacy plugin directory)."""
    adapter = LegacyProvider(runner, settings)
    kit = Kit(adapter, options)
    hidden = ", ".join(invisible_classes(LEGACY_FEATURES))
    kit.rows.append(
        CheckResult(
            "legacy LSF plugin detected",
            True,
            "no describeProvider.sh/listMachines.sh: runs in legacy mode with LSF inputs only; orphan classes "
            f"it cannot show: {hidden}",
        )
    )
    kit.can_list = False  # its machines are found through its requests' status only
    template = await kit.step("getAvailableTemplates is valid", lambda: _check_templates(kit, runner))
    op_id = f"conformance-{kit._nonce}"
    try:
        request_id = await kit.step(
            "requestMachines gives a valid answer", lambda: kit.check_request(op_id, template), template
        )
        machines = await kit.step(
            "getRequestStatus reaches complete with every machine",
            lambda: kit.check_complete(request_id, template),
            request_id,
        )
        await kit.step("requestReturnMachines works and is confirmed", lambda: kit.check_return(machines), machines)
        await kit.step("getReturnRequests is valid", lambda: kit.check_return_requests(machines))
        await _check_refused(kit)
    finally:
        with trio.CancelScope(shield=True):
            await kit.return_everything()
    await kit.step("join tokens never come back", kit.check_tokens)
    for guarantee in lacking_guarantees(LEGACY_FEATURES, legacy=True):
        kit.rows.append(
            CheckResult(f"not offered: {guarantee.name}", True, f"lost: {guarantee.lost}; instead: {guarantee.instead}")
        )
    return kit.rows


async def _check_templates(kit: Kit, runner: OneShotProvider) -> tuple[dict[str, Any], str]:
    """The templates check, with what the plugin's conf dir holds when it found none usable (an LSF plugin
    reads its files from a fixed place under ``PRO_CONF_DIR``; a dir one level off gives an empty answer)."""
    try:
        return await kit.check_templates(None)
    except (CheckFailed, ProviderError) as exc:
        raise CheckFailed(f"{_why(exc)}; {conf_hint(runner.config.conf_dir)}") from None


def conf_hint(conf_dir: str) -> str:
    """Which template files were looked for where under ``conf_dir`` (``PRO_CONF_DIR``), and what was found."""
    if not conf_dir:
        return "PRO_CONF_DIR is empty: give --conf-dir (the directory the plugin's *prov_templates.json is under)"
    root = Path(conf_dir)
    places = []
    for where in (root, root / CONF_SUBDIR):
        found = sorted(p.name for p in where.glob(TEMPLATE_GLOB)) if where.is_dir() else []
        state = ("found " + ", ".join(found[:5])) if found else ("missing" if not where.is_dir() else "no file")
        places.append(f"{where}/{TEMPLATE_GLOB}: {state}")
    hint = "; ".join(places)
    if not (root / CONF_SUBDIR).is_dir() and any(root.glob(TEMPLATE_GLOB)):
        hint += (
            f" (plugins such as awsv2 read $PRO_CONF_DIR/{CONF_SUBDIR}/awsprov_templates.json: "
            f"try --conf-dir {root.parent})"
        )
    return f"looked for the plugin's templates at {hint}"


async def _check_refused(kit: Kit) -> None:
    """An unknown template should be refused; a legacy plugin that accepts it only gets a warning: the daemon
    never sends one (it asks for the templates the plugin lists). Whatever it made is returned with the rest."""
    name = "an unknown template is refused"
    op_id = f"conformance-bad-{kit._nonce}"
    try:
        out = await kit.ask(kit.request_input(op_id, f"no-such-template-{kit._nonce}", 1))
    except ProviderRejected as exc:
        kit.rows.append(CheckResult(name, True, f"refused ({exc.code}: {exc.message[:80]!r})"))
        return
    except ProviderError as exc:
        kit.rows.append(CheckResult(name, True, f"not refused cleanly: {_why(exc)}", warning=True))
        return
    kit.rows.append(
        CheckResult(
            name,
            True,
            f"accepted as {out['requestId']!r} (a warning: the daemon only asks for templates the plugin lists)",
            warning=True,
        )
    )


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc.detail}"[:600] if isinstance(exc, ProviderError) else str(exc)[:600]


async def legacy_checks(client: PluginTransport, options: KitOptions) -> list[CheckResult]:
    """The LSF checks for a legacy plugin, run through the legacy adapter; ``client`` is its one-shot client."""
    if not isinstance(client, OneShotProvider):
        return [CheckResult("legacy LSF plugin detected", False, "legacy mode runs one-shot plugins only")]
    return await run_legacy_kit(client, options)
