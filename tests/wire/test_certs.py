"""``provisionerd certs init``: the files, their modes, and what each certificate binds."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provisionerd.cli import main as cli
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import Role
from provisionerd.pki import certs

ROLES = [r.value for r in Role]


def _cert(directory, name):
    return x509.load_pem_x509_certificate((directory / f"{name}.pem").read_bytes())


def test_init_writes_a_ca_and_one_certificate_per_role_with_private_keys(certs_dir):
    for name in ["ca", *ROLES]:
        assert stat.S_IMODE((certs_dir / f"{name}.key").stat().st_mode) == 0o600
        assert (certs_dir / f"{name}.pem").is_file()
    ca = _cert(certs_dir, "ca")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role in ROLES:
        cert = _cert(certs_dir, role)
        assert cert.issuer == ca.subject
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, _ecdsa(cert))
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [f"provisionerd://alpha/{role}"]
        assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == role
        assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "alpha"


def _ecdsa(cert):
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.ECDSA(cert.signature_hash_algorithm)


def test_only_the_controller_is_a_server_and_it_names_localhost(certs_dir):
    controller = _cert(certs_dir, "controller")
    san = controller.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1"}
    for role in ("provisioner", "worker", "admin"):
        usages = _cert(certs_dir, role).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_read_cluster(certs_dir):
    assert certs.read_cluster(certs_dir) == "alpha"


def test_init_refuses_to_overwrite_unless_forced(tmp_path):
    certs.init_certs(tmp_path, "c1", hosts=["ctl.example"])
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        certs.init_certs(tmp_path, "c1")
    assert (tmp_path / "ca.key").read_bytes() == before
    certs.init_certs(tmp_path, "c2", force=True)
    assert (tmp_path / "ca.key").read_bytes() != before
    assert certs.read_cluster(tmp_path) == "c2"
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


@pytest.mark.parametrize("cluster", ["", "a b", "../x", "a/b", "-lead", "x" * 64])
def test_bad_cluster_names_are_refused(tmp_path, cluster):
    with pytest.raises(ConfigError, match="cluster name"):
        certs.init_certs(tmp_path, cluster)


@pytest.mark.parametrize(
    "uri, parsed",
    [
        ("provisionerd://alpha/worker", ("alpha", "worker")),
        ("provisionerd://alpha/", None),
        ("provisionerd:///worker", None),
        ("provisionerd://alpha/worker/x", None),
        ("https://alpha/worker", None),
    ],
)
def test_parse_role_uri(uri, parsed):
    assert certs.parse_role_uri(uri) == parsed


def test_cli_init_and_errors(tmp_path, capsys):
    target = tmp_path / "c"
    assert cli.main(["certs", "init", str(target), "--cluster", "demo", "--host", "10.0.0.5"]) == 0
    assert str(target / "controller.pem") in capsys.readouterr().out
    san = _cert(target, "controller").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert cli.main(["certs", "init", str(target), "--cluster", "demo"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert cli.main(["certs", "init", str(tmp_path / "d")]) == 2  # --cluster is required
    assert cli.main(["certs"]) == 2
