"""The conformance kit for a legacy LSF plugin: the LSF checks, through the adapter the daemon would use.

A legacy plugin is not failed for lacking our extensions: the kit says it is legacy, checks what the LSF contract
promises (templates are valid; a request reaches ``complete`` with every machine asked for; a return completes and
is confirmed by the machine's own create request; ``getReturnRequests`` answers validly; an unknown template is
refused; no join token ever comes back) and lists, as rows of their own, the guarantees it lacks with what the
daemon does instead. Exit 0 when the LSF checks pass.
"""

from __future__ import annotations

from typing import Any

from provisionerd.domain.errors import ProviderRejected
from provisionerd.provider.kit import CheckFailed, CheckResult, Kit, KitOptions
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.rules import LEGACY_FEATURES, invisible_classes, lacking_guarantees
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import PluginTransport

_DEFAULT_SETTINGS = LegacySettings()


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
    template = await kit.step("getAvailableTemplates is valid", lambda: kit.check_templates(None))
    op_id = f"conformance-{kit._nonce}"
    created: list[dict[str, Any]] | None = None
    try:
        request_id = await kit.step(
            "requestMachines gives a valid answer", lambda: kit.check_request(op_id, template), template
        )
        machines = await kit.step(
            "getRequestStatus reaches complete with every machine",
            lambda: kit.check_complete(request_id, template),
            request_id,
        )
        created = machines
        returned = await kit.step(
            "requestReturnMachines works and is confirmed", lambda: kit.check_return(machines), machines
        )
        if returned:
            created = None
        await kit.step("getReturnRequests is valid", lambda: kit.check_return_requests(machines))
        await kit.step("an unknown template is refused", lambda: _check_refused(kit))
    finally:
        if created:
            await kit.cleanup(created)
    await kit.step("join tokens never come back", kit.check_tokens)
    for guarantee in lacking_guarantees(LEGACY_FEATURES, legacy=True):
        kit.rows.append(
            CheckResult(f"not offered: {guarantee.name}", True, f"lost: {guarantee.lost}; instead: {guarantee.instead}")
        )
    return kit.rows


async def _check_refused(kit: Kit) -> str:
    op_id = f"conformance-bad-{kit._nonce}"
    try:
        out = await kit.rpc.call("requestMachines", kit.request_input(op_id, f"no-such-template-{kit._nonce}", 1))
    except ProviderRejected as exc:
        return f"refused ({exc.code}: {exc.message[:80]!r})"
    raise CheckFailed(f"an unknown templateId was accepted: {out}")


async def legacy_checks(client: PluginTransport, options: KitOptions) -> list[CheckResult]:
    """The LSF checks for a legacy plugin, run through the legacy adapter; ``client`` is its one-shot client."""
    if not isinstance(client, OneShotProvider):
        return [CheckResult("legacy LSF plugin detected", False, "legacy mode runs one-shot plugins only")]
    return await run_legacy_kit(client, options)
