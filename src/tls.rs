//! TLS, both directions, with ring as the only crypto provider.
//!
//! * Server: the certificate comes from a swappable [`CertStore`] (the workload API renews it
//!   without dropping the listener); outside IoT Edge a self-signed certificate is created on
//!   first start and kept in the metadata directory. Client certificates are *requested* but not
//!   required, so SAS-key clients still connect; whether a verified certificate was presented is
//!   recorded per connection and judged by the one auth check in `api`.
//! * Outbound: `skipServerCertValidation` or `allowUnknownCA` (the original's default) accept any
//!   server certificate, still verifying the handshake signature; otherwise the Mozilla roots plus
//!   the IoT Edge trust bundle are used with host-name checks.

mod identity;

pub use identity::common_name;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use std::path::Path;
use std::sync::{Arc, RwLock};

/// The crypto provider used everywhere.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Install ring as the process default. Idempotent. gridlet's own configurations all name ring
/// explicitly ([`provider`]), so nothing in the binary needs this; it is a safety net for library
/// code that builds a rustls configuration from the process default (and the tests' reqwest
/// client, built with `rustls-no-provider`, does need it).
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A TLS setup failure.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate or key material is unusable.
    #[error("TLS material: {0}")]
    Material(String),
    /// File I/O.
    #[error("TLS files in {path}: {source}")]
    Io {
        /// Directory or file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Parse a PEM certificate chain and private key into a [`CertifiedKey`].
///
/// # Errors
/// Unparseable PEM or an unsupported key type.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Material(format!("certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Material("no certificate in PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Material(format!("private key PEM: {e}")))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| TlsError::Material(format!("private key: {e}")))?;
    Ok(CertifiedKey::new(certs, signing))
}

/// Parse PEM certificates into a root store (trust bundles).
///
/// # Errors
/// Unparseable PEM.
pub fn root_store(pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| TlsError::Material(format!("trust bundle PEM: {e}")))?;
        roots
            .add(c)
            .map_err(|e| TlsError::Material(format!("trust bundle certificate: {e}")))?;
    }
    Ok(roots)
}

/// Load the self-signed server certificate from `dir`, creating it on first start.
///
/// # Errors
/// The directory cannot be written, or existing files are unusable.
pub fn load_or_create_self_signed(
    dir: &Path,
    names: &[String],
) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let cert_path = dir.join("server-cert.pem");
    let key_path = dir.join("server-key.pem");
    let io = |path: &Path| {
        let p = path.display().to_string();
        move |source| TlsError::Io { path: p, source }
    };
    if cert_path.exists() && key_path.exists() {
        let cert = std::fs::read(&cert_path).map_err(io(&cert_path))?;
        let key = std::fs::read(&key_path).map_err(io(&key_path))?;
        certified_key(&cert, &key)?;
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::Material(format!("generating a self-signed certificate: {e}")))?;
    let cert = generated.cert.pem().into_bytes();
    let key = generated.signing_key.serialize_pem().into_bytes();
    write_private(&key_path, &key).map_err(io(&key_path))?;
    std::fs::write(&cert_path, &cert).map_err(io(&cert_path))?;
    Ok((cert, key))
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(data)
}

/// The server certificate, swappable while the listener runs (certificate renewal).
#[derive(Debug)]
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    /// Start with `key`.
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Replace the certificate; new handshakes use it, open connections are untouched.
    pub fn replace(&self, key: CertifiedKey) {
        let mut g = crate::sync::write(&self.current);
        *g = Arc::new(key);
    }

    /// The certificate in use.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The handshake-signature checks of a verifier that accepts any certificate (both
/// [`AnyClientCert`] and [`AnyServerCert`]): rustls' own checks with the provider's algorithms
/// (`self.algs`), so the peer still proves it holds the certificate's key.
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algs.supported_schemes()
        }
    };
}

/// Accepts any well-formed client certificate (`allowUnknownCA=true`), still checking that the
/// client holds its key. Never requires a certificate: SAS-key clients connect without one.
#[derive(Debug)]
struct AnyClientCert {
    algs: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    handshake_signatures!();
    fn client_auth_mandatory(&self) -> bool {
        false
    }
}

/// How inbound client certificates are judged.
pub enum ClientCerts {
    /// Not requested.
    Off,
    /// Any certificate (allowUnknownCA) and no roots to verify one against: a certificate
    /// authenticates, but its subject names nobody (no identity).
    AnyCa,
    /// Any certificate (allowUnknownCA, under IoT Edge); its subject is an identity only when
    /// its chain verifies against these roots (the trust bundle).
    AnyCaIdentityFrom(RootCertStore),
    /// Must chain to these roots (the IoT Edge trust bundle).
    Roots(RootCertStore),
}

/// Whether a presented client certificate's subject can be believed: only when its chain was
/// verified. With `allowUnknownCA=true` anyone can write any CN into a self-signed certificate,
/// so an unverified certificate authenticates (the original's behaviour) but carries no
/// identity (`inbound__clientAuth__clientCert__adminIdentities` never matches it).
#[derive(Clone)]
pub enum IdentityCheck {
    /// No certificate is verified (no roots): no identities.
    Never,
    /// rustls verified every accepted certificate against the roots in the handshake.
    Always,
    /// Verify the presented chain against these roots after the handshake.
    Against(Arc<dyn ClientCertVerifier>),
}

impl std::fmt::Debug for IdentityCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Never => "Never",
            Self::Always => "Always",
            Self::Against(_) => "Against(roots)",
        })
    }
}

impl IdentityCheck {
    /// How `client` certificates get an identity.
    ///
    /// # Errors
    /// The roots make no verifier.
    pub fn new(client: &ClientCerts) -> Result<Self, TlsError> {
        Ok(match client {
            ClientCerts::Off | ClientCerts::AnyCa => Self::Never,
            ClientCerts::Roots(_) => Self::Always,
            ClientCerts::AnyCaIdentityFrom(roots) => Self::Against(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots.clone()), provider())
                    .build()
                    .map_err(|e| TlsError::Material(format!("client certificate verifier: {e}")))?,
            ),
        })
    }

    /// Whether the `chain` a peer presented is verified, and its identity (subject CN) if so.
    pub fn check(&self, chain: &[CertificateDer<'_>]) -> PeerCert {
        let Some((first, rest)) = chain.split_first() else {
            return PeerCert::None;
        };
        let verified = match self {
            Self::Never => false,
            Self::Always => true,
            Self::Against(v) => v.verify_client_cert(first, rest, UnixTime::now()).is_ok(),
        };
        if verified {
            PeerCert::Verified(common_name(first))
        } else {
            PeerCert::Unverified
        }
    }
}

/// What a client certificate proves ([`IdentityCheck::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCert {
    /// No certificate was presented.
    None,
    /// Accepted (`allowUnknownCA=true`) but not chained to the trust bundle: anyone can make
    /// one, so it names nobody and may only publish.
    Unverified,
    /// Chained to the trust bundle; its subject CN, if it has one.
    Verified(Option<String>),
}

/// The HTTPS listener's configuration.
///
/// # Errors
/// rustls refuses the combination.
pub fn server_config(
    certs: Arc<CertStore>,
    client: ClientCerts,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ClientCertVerifier> = match client {
        ClientCerts::Off => WebPkiClientVerifier::no_client_auth(),
        ClientCerts::AnyCa | ClientCerts::AnyCaIdentityFrom(_) => Arc::new(AnyClientCert {
            algs: provider.signature_verification_algorithms,
        }),
        ClientCerts::Roots(roots) => {
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Material(format!("client certificate verifier: {e}")))?
        }
    };
    let mut cfg = builder
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(certs);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Accepts any server certificate, still verifying handshake signatures.
#[derive(Debug)]
struct AnyServerCert {
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    handshake_signatures!();
}

/// Outbound TLS settings.
pub struct OutboundTls {
    /// Accept any server certificate (`skipServerCertValidation` or `allowUnknownCA`).
    pub accept_any_server_cert: bool,
    /// Extra trusted roots (IoT Edge trust bundle), PEM.
    pub extra_roots_pem: Option<Vec<u8>>,
    /// Client identity (PEM chain, PEM key) presented to servers.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The rustls client configuration for outbound calls.
///
/// # Errors
/// Unusable trust bundle or identity.
pub fn client_config(o: &OutboundTls) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = if o.accept_any_server_cert {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert {
                algs: provider.signature_verification_algorithms,
            }))
    } else {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(pem) = &o.extra_roots_pem {
            for c in root_store(pem)?.roots {
                roots.roots.push(c);
            }
        }
        builder.with_root_certificates(roots)
    };
    let mut cfg = match &o.identity {
        Some((cert, key)) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Material(format!("identity certificate PEM: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| TlsError::Material(format!("identity key PEM: {e}")))?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
