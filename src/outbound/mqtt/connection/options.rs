//! What a [`ConnectionSpec`] becomes at connect time: the rustls configuration, MQTT 5
//! enhanced-authentication data, the check of the broker's address against the denied ranges,
//! and rumqttc's options (v5 and 3.1.1).

use super::{
    bad, ClientIdentity, ConnectionSpec, EdgeTls, EnhancedAuth, Protocol, Scheme, Secret,
    SpecError, K8S_SAT,
};
use crate::tls;
use bytes::Bytes;
use rumqttc::v5;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;
use std::path::PathBuf;
use std::sync::Arc;

impl ConnectionSpec {
    /// The rustls configuration for an `mqtts://` connection (`None` for `mqtt://`). Reads the
    /// CA and client certificate files now, so a missing file is an error naming its field.
    ///
    /// # Errors
    /// An unreadable or unusable file, or `tls.clientIdentity: IoTEdge` outside IoT Edge.
    pub fn tls_config(
        &self,
        edge: &EdgeTls,
    ) -> Result<Option<Arc<rustls::ClientConfig>>, SpecError> {
        if self.endpoint.scheme == Scheme::Mqtt {
            return Ok(None);
        }
        let read = |field: &'static str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| bad(field, format!("cannot read {}: {e}", path.display())))
        };
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                let pem = read("tls.caFile", path)?;
                roots = tls::root_store(&pem).map_err(|e| bad("tls.caFile", e.to_string()))?;
                if roots.is_empty() {
                    return Err(bad("tls.caFile", "no certificate in the file"));
                }
            }
            None => {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                if let Some(pem) = &edge.trust_bundle_pem {
                    let bundle =
                        tls::root_store(pem).map_err(|e| bad("tls.caFile", e.to_string()))?;
                    roots.roots.extend(bundle.roots);
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("url", format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let cfg = match &self.client_identity {
            ClientIdentity::None => builder.with_no_client_auth(),
            ClientIdentity::Files { cert, key } => {
                let certs: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(&read("tls.certFile", cert)?)
                        .collect::<Result<_, _>>()
                        .map_err(|e| bad("tls.certFile", format!("certificate PEM: {e}")))?;
                if certs.is_empty() {
                    return Err(bad("tls.certFile", "no certificate in the file"));
                }
                let key = PrivateKeyDer::from_pem_slice(&read("tls.keyFile", key)?)
                    .map_err(|e| bad("tls.keyFile", format!("private key PEM: {e}")))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad("tls.keyFile", format!("client certificate: {e}")))?
            }
            ClientIdentity::IotEdge => {
                let resolver = edge.identity.clone().ok_or_else(|| {
                    bad(
                        "tls.clientIdentity",
                        "IoTEdge needs gridlet to run as an IoT Edge module with outbound__clientAuth__clientCert__enabled=true",
                    )
                })?;
                builder.with_client_cert_resolver(resolver)
            }
        };
        Ok(Some(Arc::new(cfg)))
    }

    /// The authentication data to send: the token file's contents, read now (the kubelet
    /// rotates the token, so this runs before every connect).
    ///
    /// # Errors
    /// The token file cannot be read or is empty.
    pub fn authentication_data(&self) -> Result<Option<Bytes>, SpecError> {
        match &self.enhanced_auth {
            None => Ok(None),
            Some(EnhancedAuth::K8sSat { token_file }) => {
                let token = std::fs::read(token_file).map_err(|e| {
                    bad(
                        "authentication.tokenFile",
                        format!("cannot read {}: {e}", token_file.display()),
                    )
                })?;
                let trimmed = token.trim_ascii();
                if trimmed.is_empty() {
                    return Err(bad("authentication.tokenFile", "the token file is empty"));
                }
                Ok(Some(Bytes::copy_from_slice(trimmed)))
            }
        }
    }

    /// Refuse a broker whose host resolves to an address in a denied range
    /// (`outbound__deniedAddressRanges`); run before every connect (an address literal is also
    /// checked when the connection is made through the API).
    ///
    /// # Errors
    /// The host does not resolve, or an address it resolves to is denied.
    pub async fn check_address(&self, denied: &[crate::config::IpRange]) -> Result<(), String> {
        if denied.is_empty() {
            return Ok(());
        }
        let addrs = tokio::net::lookup_host((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", self.endpoint.host))?;
        for a in addrs {
            if let Some(r) = denied.iter().find(|r| r.contains(a.ip())) {
                return Err(format!(
                    "the broker's address {} is in the denied range {r} ({})",
                    a.ip(),
                    crate::config::Key::outbound__deniedAddressRanges.name()
                ));
            }
        }
        Ok(())
    }

    /// rumqttc MQTT 5 options: endpoint, TLS (`tls` from [`Self::tls_config`]), client id,
    /// credentials, enhanced authentication (token read now), keep-alive, session, receive
    /// maximum, packet size. Manual acknowledgements and the outgoing in-flight limit are the
    /// caller's choice.
    ///
    /// # Errors
    /// `protocolVersion` is 3.1.1, or the token file cannot be read.
    pub fn v5_options(
        &self,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<v5::MqttOptions, SpecError> {
        if self.protocol != Protocol::V5 {
            return Err(bad("protocolVersion", "this connection speaks MQTT 3.1.1"));
        }
        let mut o = v5::MqttOptions::new(&self.client_id, &self.endpoint.host, self.endpoint.port);
        o.set_keep_alive(self.keep_alive);
        o.set_clean_start(self.clean_start);
        if let Some(u) = &self.username {
            let p = self.password.as_ref().map(Secret::expose).unwrap_or("");
            o.set_credentials(u.clone(), p);
        } else if let Some(p) = &self.password {
            // MQTT 5 allows a password without a user name.
            o.set_credentials("", p.expose());
        }
        o.set_session_expiry_interval(Some(self.session_expiry_secs));
        o.set_receive_maximum(Some(self.receive_maximum));
        o.set_max_packet_size(Some(self.max_packet_bytes));
        if let Some(EnhancedAuth::K8sSat { .. }) = &self.enhanced_auth {
            o.set_authentication_method(Some(K8S_SAT.to_string()));
            o.set_authentication_data(self.authentication_data()?);
        }
        if let Some(tls) = tls {
            o.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls),
            ));
        }
        Ok(o)
    }

    /// Before a reconnect: re-read what may have changed since the options were made (the
    /// service-account token).
    ///
    /// # Errors
    /// The token file cannot be read.
    pub fn refresh_v5(&self, o: &mut v5::MqttOptions) -> Result<(), SpecError> {
        if self.enhanced_auth.is_some() {
            o.set_authentication_data(self.authentication_data()?);
        }
        Ok(())
    }

    /// rumqttc MQTT 3.1.1 options (no session expiry, receive maximum or enhanced
    /// authentication in 3.1.1: the session is kept while `cleanStart` is false).
    ///
    /// # Errors
    /// `protocolVersion` is 5.
    pub fn v311_options(
        &self,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<rumqttc::MqttOptions, SpecError> {
        if self.protocol != Protocol::V311 {
            return Err(bad("protocolVersion", "this connection speaks MQTT 5"));
        }
        let mut o =
            rumqttc::MqttOptions::new(&self.client_id, &self.endpoint.host, self.endpoint.port);
        o.set_keep_alive(self.keep_alive);
        o.set_clean_session(self.clean_start);
        if let Some(u) = &self.username {
            let p = self.password.as_ref().map(Secret::expose).unwrap_or("");
            o.set_credentials(u.clone(), p);
        }
        let max = self.max_packet_bytes as usize;
        o.set_max_packet_size(max, max);
        if let Some(tls) = tls {
            o.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls),
            ));
        }
        Ok(o)
    }
}
