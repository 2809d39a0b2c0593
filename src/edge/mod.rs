//! Running as an Azure IoT Edge module: what changes when `IOTEDGE_WORKLOADURI` is set.
//!
//! * [`workload`]: the workload API client (server/identity certificates, trust bundle, `sign`).
//! * [`sas`]: SAS tokens for the module identity.
//! * [`edgehub`]: the MQTT connection to edgeHub and the `EdgeHub` destination's sink.
//! * [`twin`]: topics and subscriptions from the module twin.
//!
//! [`EdgeRuntime::connect`] fetches the material at start-up (a failure stops the start, and
//! edgeAgent restarts the module); [`EdgeRuntime::start`] spawns the tasks it owns: the edgeHub
//! connection, the twin handler and the certificate renewals. Dropping the runtime aborts them.
//!
//! Why not `azure_iot_sdk`: its last release (0.8.0, 2021) is device-only (no module identity,
//! no outputs, no workload API) and brings OpenSSL into the ARM build. edgeHub's MQTT surface
//! that a module needs is small, so it is spoken here with rumqttc over rustls.

pub mod edgehub;
pub(crate) mod sas;
pub mod twin;
pub mod workload;

use crate::broker::Broker;
use crate::clock::Clock;
use crate::config::Config;
use crate::outbound::http::HttpClient;
use crate::sync::AbortOnDrop;
use crate::tls::{self, CertStore, ClientCerts, OutboundTls, TlsError};
use edgehub::{EdgeHub, HubConnection, HubMessage, HubSettings};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;
use workload::{IssuedCert, ModuleIdentity, WorkloadClient, WorkloadError};

/// Default edgeHub MQTT port.
pub const EDGEHUB_MQTT_PORT: u16 = 8883;
/// Requested server certificate lifetime (the original's sample: 90 days).
const SERVER_CERT_DAYS: u64 = 90;
/// Requested identity certificate lifetime (the original's sample: 7 days).
const IDENTITY_CERT_DAYS: u64 = 7;
/// Retry delay after a failed renewal.
const RENEW_RETRY: Duration = Duration::from_secs(30);

/// Why the IoT Edge integration could not start.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// A required `IOTEDGE_*` variable is missing.
    #[error("{0} is not set; is gridlet running as an IoT Edge module?")]
    MissingEnv(&'static str),
    /// The workload API failed.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// Material from the workload API is unusable.
    #[error("certificate material from the workload API: {0}")]
    Tls(#[from] TlsError),
}

/// The identity certificate presented on outbound calls; swapped on renewal.
#[derive(Debug, Default)]
pub struct IdentityStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl IdentityStore {
    /// Replace the identity (new connections present it).
    pub fn replace(&self, key: CertifiedKey) {
        *crate::sync::write(&self.current) = Some(Arc::new(key));
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ResolvesClientCert for IdentityStore {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.get()
    }

    fn has_certs(&self) -> bool {
        self.get().is_some()
    }
}

/// Certificates, edgeHub connection and twin of a module running under IoT Edge.
pub struct EdgeRuntime {
    workload: WorkloadClient,
    clock: Clock,
    module_id: String,
    trust_bundle_pem: String,
    server_cert: Option<IssuedCert>,
    identity: Option<(Arc<IdentityStore>, Option<u64>)>,
    hub: Option<(EdgeHub, HubConnection, mpsc::Receiver<HubMessage>)>,
    hub_handle: Option<EdgeHub>,
    tasks: Vec<AbortOnDrop>,
}

fn now_secs(clock: &Clock) -> u64 {
    clock.now_ms() / 1000
}

/// `host` or `host:port` (the port form is for development and tests; IoT Edge sets the host).
fn split_host_port(s: &str) -> (String, u16) {
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h.to_string(), port),
            Err(_) => (s.to_string(), EDGEHUB_MQTT_PORT),
        },
        _ => (s.to_string(), EDGEHUB_MQTT_PORT),
    }
}

/// When to renew a certificate that expires at `expires_at`: at 80 % of the remaining lifetime,
/// at least one second from now, and daily when the expiry is unknown.
pub fn renew_after(now: u64, expires_at: Option<u64>) -> Duration {
    match expires_at {
        Some(exp) => {
            Duration::from_secs(exp.saturating_sub(now) * 4 / 5).max(Duration::from_secs(1))
        }
        None => Duration::from_secs(24 * 3600),
    }
}

impl EdgeRuntime {
    /// Read the workload API: trust bundle, server certificate (when HTTPS listens), identity
    /// certificate (when outbound client auth is on); prepare the edgeHub connection.
    ///
    /// # Errors
    /// Missing `IOTEDGE_*` variables or a failing workload API.
    pub async fn connect(cfg: &Config, clock: Clock) -> Result<Self, EdgeError> {
        let env = &cfg.edge;
        let uri = env
            .workload_uri
            .as_deref()
            .ok_or(EdgeError::MissingEnv("IOTEDGE_WORKLOADURI"))?;
        let generation_id = env
            .generation_id
            .clone()
            .ok_or(EdgeError::MissingEnv("IOTEDGE_MODULEGENERATIONID"))?;
        let workload = WorkloadClient::new(
            uri,
            ModuleIdentity {
                module_id: env.module_id.clone(),
                generation_id,
                api_version: env.api_version.clone(),
            },
        )?;
        let trust_bundle_pem = workload.trust_bundle().await?;
        let roots = tls::root_store(trust_bundle_pem.as_bytes())?;
        let now = now_secs(&clock);
        let server_cert = if cfg.inbound.tls_policy.https() {
            let c = workload
                .server_certificate(&env.module_id, now + SERVER_CERT_DAYS * 86_400)
                .await?;
            tls::certified_key(c.certificate_pem.as_bytes(), c.private_key_pem.as_bytes())?;
            Some(c)
        } else {
            None
        };
        let identity = if cfg.outbound.client_cert_enabled {
            let c = workload
                .identity_certificate(now + IDENTITY_CERT_DAYS * 86_400)
                .await?;
            let store = Arc::new(IdentityStore::default());
            store.replace(tls::certified_key(
                c.certificate_pem.as_bytes(),
                c.private_key_pem.as_bytes(),
            )?);
            Some((store, c.expires_at))
        } else {
            None
        };
        let hub = match (&env.iothub_hostname, &env.gateway_hostname) {
            (Some(hub_hostname), Some(gateway)) => {
                let (host, port) = split_host_port(gateway);
                let mqtt_tls = rustls::ClientConfig::builder_with_provider(tls::provider())
                    .with_safe_default_protocol_versions()
                    .map_err(TlsError::from)?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                let settings = HubSettings {
                    host,
                    port,
                    hub_hostname: hub_hostname.clone(),
                    device_id: env.device_id.clone(),
                    module_id: env.module_id.clone(),
                    tls: Some(Arc::new(mqtt_tls)),
                    token_ttl: edgehub::DEFAULT_TOKEN_TTL,
                };
                Some(EdgeHub::new(settings, workload.clone(), clock))
            }
            _ => {
                tracing::warn!("IOTEDGE_IOTHUBHOSTNAME or IOTEDGE_GATEWAYHOSTNAME is not set: no edgeHub connection (EdgeHub destinations and the module twin are off)");
                None
            }
        };
        tracing::info!(module = %env.module_id, "IoT Edge workload API ready");
        Ok(Self {
            workload,
            clock,
            module_id: env.module_id.clone(),
            trust_bundle_pem,
            server_cert,
            identity,
            hub_handle: hub.as_ref().map(|(h, _, _)| h.clone()),
            hub,
            tasks: Vec::new(),
        })
    }

    /// The HTTPS certificate from the workload API, in a swappable store.
    ///
    /// # Errors
    /// Unusable material (checked at connect already), or HTTPS is off.
    pub fn server_cert_store(&self) -> Result<Arc<CertStore>, EdgeError> {
        let c = self
            .server_cert
            .as_ref()
            .ok_or_else(|| TlsError::Material("no server certificate was requested".into()))?;
        Ok(CertStore::new(tls::certified_key(
            c.certificate_pem.as_bytes(),
            c.private_key_pem.as_bytes(),
        )?))
    }

    /// How inbound client certificates are judged: against the trust bundle unless
    /// `allowUnknownCA`; then any certificate authenticates, but only one that chains to the
    /// trust bundle carries an identity.
    ///
    /// # Errors
    /// An unusable trust bundle.
    pub fn client_certs(&self, cfg: &Config) -> Result<ClientCerts, EdgeError> {
        Ok(if !cfg.inbound.client_cert_enabled {
            ClientCerts::Off
        } else if cfg.inbound.client_cert_allow_unknown_ca {
            ClientCerts::AnyCaIdentityFrom(tls::root_store(self.trust_bundle_pem.as_bytes())?)
        } else {
            ClientCerts::Roots(tls::root_store(self.trust_bundle_pem.as_bytes())?)
        })
    }

    /// The outbound HTTP client: trust bundle as extra roots (besides `base`'s), identity certificate presented
    /// when `outbound__clientAuth__clientCert__enabled`.
    ///
    /// # Errors
    /// Unusable material.
    pub fn outbound_http_client(
        &self,
        base: OutboundTls,
        timeout: Duration,
    ) -> Result<HttpClient, EdgeError> {
        let mut roots = base.extra_roots_pem.clone().unwrap_or_default();
        roots.extend_from_slice(b"\n");
        roots.extend_from_slice(self.trust_bundle_pem.as_bytes());
        let o = OutboundTls {
            extra_roots_pem: Some(roots),
            identity: None,
            ..base
        };
        let mut client_cfg = tls::client_config(&o)?;
        if let Some((store, _)) = &self.identity {
            client_cfg.client_auth_cert_resolver = store.clone();
        }
        Ok(crate::outbound::http::HttpClient::new(client_cfg, timeout))
    }

    /// What IoT Edge adds to MQTT connections' TLS: the trust bundle, and the identity
    /// certificate when `outbound__clientAuth__clientCert__enabled`.
    pub fn mqtt_tls(&self) -> crate::outbound::mqtt::connection::EdgeTls {
        crate::outbound::mqtt::connection::EdgeTls {
            trust_bundle_pem: Some(self.trust_bundle_pem.as_bytes().to_vec()),
            identity: self
                .identity
                .as_ref()
                .map(|(s, _)| s.clone() as Arc<dyn ResolvesClientCert>),
        }
    }

    /// The edgeHub connection, when IoT Edge gave enough to make one.
    pub fn edgehub(&self) -> Option<EdgeHub> {
        self.hub_handle.clone()
    }

    /// Start the owned tasks: edgeHub connection and twin (applied to `broker` and its MQTT
    /// sources `mqtt`), and renewal of the server certificate in `certs` and of the identity
    /// certificate.
    pub fn start(
        &mut self,
        broker: Broker,
        mqtt: Arc<crate::ingress::manage::Mqtt>,
        certs: Option<Arc<CertStore>>,
    ) {
        if let Some((hub, conn, rx)) = self.hub.take() {
            self.tasks.push(AbortOnDrop(tokio::spawn(conn.run())));
            let twin = twin::TwinManager::new(broker, mqtt, hub);
            self.tasks.push(AbortOnDrop(tokio::spawn(twin.run(rx))));
        }
        if let (Some(store), Some(c)) = (certs, &self.server_cert) {
            let w = self.workload.clone();
            let clock = self.clock;
            let cn = self.module_id.clone();
            let first = c.expires_at;
            self.tasks.push(AbortOnDrop(tokio::spawn(async move {
                renew_loop(clock, first, "server", move || {
                    let w = w.clone();
                    let cn = cn.clone();
                    let store = store.clone();
                    async move {
                        let c = w
                            .server_certificate(&cn, now_secs(&clock) + SERVER_CERT_DAYS * 86_400)
                            .await?;
                        let key = tls::certified_key(
                            c.certificate_pem.as_bytes(),
                            c.private_key_pem.as_bytes(),
                        )?;
                        store.replace(key);
                        Ok(c.expires_at)
                    }
                })
                .await
            })));
        }
        if let Some((store, first)) = self.identity.clone() {
            let w = self.workload.clone();
            let clock = self.clock;
            self.tasks.push(AbortOnDrop(tokio::spawn(async move {
                renew_loop(clock, first, "identity", move || {
                    let w = w.clone();
                    let store = store.clone();
                    async move {
                        let c = w
                            .identity_certificate(now_secs(&clock) + IDENTITY_CERT_DAYS * 86_400)
                            .await?;
                        store.replace(tls::certified_key(
                            c.certificate_pem.as_bytes(),
                            c.private_key_pem.as_bytes(),
                        )?);
                        Ok(c.expires_at)
                    }
                })
                .await
            })));
        }
    }
}

/// Renew a certificate before it expires, forever; `renew` returns the new expiry.
async fn renew_loop<F, Fut>(clock: Clock, mut expires_at: Option<u64>, what: &'static str, renew: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<u64>, EdgeError>>,
{
    let mut wait = renew_after(now_secs(&clock), expires_at);
    loop {
        tokio::time::sleep(wait).await;
        match renew().await {
            Ok(exp) => {
                expires_at = exp;
                wait = renew_after(now_secs(&clock), expires_at);
                tracing::info!(
                    certificate = what,
                    renew_in_secs = wait.as_secs(),
                    "certificate renewed"
                );
            }
            Err(e) => {
                tracing::warn!(certificate = what, error = %e, "certificate renewal failed; retrying");
                wait = RENEW_RETRY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_happens_at_four_fifths_of_the_remaining_life() {
        assert_eq!(renew_after(1000, Some(2000)), Duration::from_secs(800));
        assert_eq!(renew_after(1000, Some(900)), Duration::from_secs(1));
        assert_eq!(renew_after(1000, None), Duration::from_secs(86_400));
    }

    #[test]
    fn gateway_host_may_carry_a_port() {
        assert_eq!(split_host_port("edgehub"), ("edgehub".into(), 8883));
        assert_eq!(
            split_host_port("localhost:18883"),
            ("localhost".into(), 18883)
        );
        assert_eq!(split_host_port("[::1]"), ("[::1]".into(), 8883));
    }
}
