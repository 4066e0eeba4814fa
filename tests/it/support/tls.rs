//! TLS for the tests: the fixture certificates of `tests/fixtures/tls/` and a rustls client
//! trusting some of them.

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio_rustls::TlsConnector;

/// A file of `tests/fixtures/tls/` (`cert.pem`/`key.pem`, `cert-b.pem`/`key-b.pem`: two
/// self-signed certificates for `localhost`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// A client that trusts the certificates of the fixture files `trusted` and offers `alpn`.
pub fn connector(trusted: &[&str], alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for name in trusted {
        for cert in CertificateDer::pem_file_iter(fixture(name)).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}
