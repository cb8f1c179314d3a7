"""The opt-in address-bound join, for machines of legacy plugins that carry nothing per machine (issue 19).

A legacy LSF plugin ignores the request's ``userData``, so no join token reaches its machines. With
``refcontroller serve --address-bound-join FILE`` a worker may instead join with

    Join{role: worker, instanceRef: "", machineId: M, token: BOOTSTRAP_PREFIX + <the cluster's bootstrap secret>}

and is admitted, once, as the instance whose ``InstanceFact`` names machine ``M``, when all of these hold
(``workers.admit_by_address``; each refusal has its reason, logged and counted):

- ``bootstrap_invalid``  the secret is the one in FILE (compared by SHA-256, in constant time);
- ``machine_unknown``    exactly one instance is named ``M`` by the committed instance facts (across providers);
- ``machine_joined``     that instance was never admitted: its token unspent and no credential issued for it (so the
                         first worker admitted for ``M``, by any path, is the only one), and its machine not gone;
- ``address_mismatch``   the connection comes from exactly the IP address the provider reported for ``M`` (none
                         reported, or a host name, never matches: no name is ever resolved).

``address_bound_off`` answers every such Join of a controller started without the option.

The accepted reply names the instance (``JoinReply.instanceRef``) and carries its credential; from then on the
worker is like any other (``credentials.py``): it rejoins with the credential, and the bootstrap secret plays no
part again. The instance's join token is spent by this admission, so it admits nothing afterwards either.

**The trust it really gives.** The bootstrap secret is the same on every machine: alone it admits nothing. What
admits is *being at the machine's address first*: whoever can send from the IP address the provider reported for
``M`` (``M`` itself, another tenant given that address after a release, anyone who can spoof or NAT through it on
that network), holds the cluster's worker certificate and the bootstrap secret, and joins before ``M``'s own agent
does, becomes ``M`` (and ``M``'s agent is then refused, which shows). That is the strength of the network between
the machines and the controller, not of a per-machine secret: use it on a private network (a VPC, a cluster
network without NAT between machines and controller), never across the internet. The per-machine token recipe
stays the stronger one for plugins that honour ``userData`` (docs/providers.md).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import stat
from pathlib import Path

import attrs

from provisionerd.agent.token import BOOTSTRAP_PREFIX
from provisionerd.domain.errors import ConfigError

__all__ = ["BOOTSTRAP_PREFIX", "AddressBoundJoin", "BootstrapFileError", "same_address"]

MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 512

BOOTSTRAP_INVALID = "bootstrap_invalid"
MACHINE_UNKNOWN = "machine_unknown"
MACHINE_JOINED = "machine_joined"
ADDRESS_MISMATCH = "address_mismatch"
ADDRESS_BOUND_OFF = "address_bound_off"
REASONS = frozenset({BOOTSTRAP_INVALID, MACHINE_UNKNOWN, MACHINE_JOINED, ADDRESS_MISMATCH, ADDRESS_BOUND_OFF})


class BootstrapFileError(ConfigError):
    """The bootstrap secret file cannot be used (the message names the path and the problem, never the content)."""


@attrs.frozen
class AddressBoundJoin:
    """The controller's side of the opt-in: the SHA-256 of the cluster's bootstrap secret."""

    secret_hash: str = attrs.field(repr=False)

    @classmethod
    def from_secret(cls, secret: str) -> AddressBoundJoin:
        if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS or not secret.isprintable() or " " in secret:
            raise BootstrapFileError(
                f"the bootstrap secret must be {MIN_SECRET_CHARS}..{MAX_SECRET_CHARS} printable characters"
            )
        return cls(hashlib.sha256(secret.encode()).hexdigest())

    @classmethod
    def from_file(cls, path: Path) -> AddressBoundJoin:
        """Read the secret from ``path``: a regular file of this user with no bits for group or others."""
        where = f"bootstrap secret file {str(path)!r}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise BootstrapFileError(f"cannot open {where}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise BootstrapFileError(
                    f"{where} must be a regular file of uid {os.getuid()} with mode 0600 (it has mode"
                    f" {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid})"
                )
            data = os.read(fd, MAX_SECRET_CHARS + 3)
        finally:
            os.close(fd)
        try:
            text = data.decode("ascii").removesuffix("\n")
        except UnicodeDecodeError:
            raise BootstrapFileError(f"{where} is not ASCII") from None
        return cls.from_secret(text)

    def admits_secret(self, token: str) -> bool:
        if not token.startswith(BOOTSTRAP_PREFIX):
            return False
        presented = hashlib.sha256(token[len(BOOTSTRAP_PREFIX) :].encode()).hexdigest()
        return secrets.compare_digest(presented, self.secret_hash)


def same_address(reported: str, peer: str) -> bool:
    """Whether the connection's peer address is the IP address the provider reported (IPv4-mapped IPv6 addresses
    compare as their IPv4 address; a host name or an empty field is never the same as anything)."""
    try:
        a, b = ipaddress.ip_address(reported.strip()), ipaddress.ip_address(peer)
    except ValueError:
        return False
    return _plain(a) == _plain(b)


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
