import datetime as dt
import ssl

from cryptography import x509

from trainyard_services.planner import certs

HOSTS = ["kubeflow-trainer-controller-manager.kubeflow-system.svc", "127.0.0.1"]
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_issued_certificate_is_signed_by_the_ca_and_names_the_hosts(tmp_path):
    bundle = certs.issue(HOSTS, now=NOW)
    assert set(bundle.names()) == set(HOSTS)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert_pem)
    assert ca.subject.rfc4514_string() == "O=kubeflow-trainer,CN=kubeflow-trainer-ca"
    leaf = x509.load_pem_x509_certificate(bundle.cert_pem)
    leaf.verify_directly_issued_by(ca)
    # Usable as a TLS server certificate.
    (tmp_path / "c").write_bytes(bundle.cert_pem)
    (tmp_path / "k").write_bytes(bundle.key_pem)
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "c", tmp_path / "k")


def test_rotation_happens_in_the_last_fifth_of_the_lifetime_and_keeps_the_ca():
    bundle = certs.issue(HOSTS, now=NOW, cert_validity=dt.timedelta(days=100))
    assert not certs.needs_rotation(bundle, HOSTS, now=NOW + dt.timedelta(days=79))
    assert certs.needs_rotation(bundle, HOSTS, now=NOW + dt.timedelta(days=81))
    assert certs.needs_rotation(bundle, ["other.svc"], now=NOW)
    rotated = certs.issue(HOSTS, now=NOW + dt.timedelta(days=81), previous=bundle)
    assert rotated.ca_cert_pem == bundle.ca_cert_pem
    assert rotated.cert_pem != bundle.cert_pem
    assert rotated.not_after > bundle.not_after


def test_an_expiring_ca_is_replaced_and_the_old_one_stays_trusted_meanwhile():
    bundle = certs.issue(HOSTS, now=NOW, ca_validity=dt.timedelta(days=10), cert_validity=dt.timedelta(days=5))
    later = NOW + dt.timedelta(days=9)
    assert certs.needs_rotation(bundle, HOSTS, now=later)
    rotated = certs.issue(HOSTS, now=later, previous=bundle, ca_validity=dt.timedelta(days=3650))
    assert rotated.ca_cert_pem != bundle.ca_cert_pem
    assert bundle.ca_cert_pem in rotated.ca_bundle_pem and rotated.ca_cert_pem in rotated.ca_bundle_pem


def test_secret_round_trip_and_garbage():
    bundle = certs.issue(HOSTS, now=NOW)
    assert certs.from_secret_data(certs.to_secret_data(bundle)) == bundle
    assert certs.from_secret_data({"tls.crt": "x"}) is None
    assert certs.from_secret_data({}) is None
