//! IoT Hub SAS tokens for a module identity (the MQTT password towards edgeHub).
//!
//! `SharedAccessSignature sr={enc(resource)}&sig={enc(base64(hmac))}&se={expiry}` where
//! `resource = {hub}/devices/{device}/modules/{module}` and the HMAC-SHA256 is taken over
//! `{enc(resource)}\n{expiry}` by the workload API (the key never leaves the daemon). `enc` is RFC
//! 3986 component encoding. Tokens are secrets: [`SasToken`]'s `Debug` hides them.

use super::workload::{encode, WorkloadClient, WorkloadError};
use base64::Engine as _;

/// A signed token and when it expires.
#[derive(Clone)]
pub struct SasToken {
    /// The full `SharedAccessSignature …` string (secret).
    pub token: String,
    /// Expiry, Unix seconds.
    pub expires_at: u64,
}

impl std::fmt::Debug for SasToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SasToken")
            .field("expires_at", &self.expires_at)
            .field("token", &"***")
            .finish()
    }
}

/// `{hub}/devices/{device}/modules/{module}`.
pub fn resource(hub_hostname: &str, device_id: &str, module_id: &str) -> String {
    format!("{hub_hostname}/devices/{device_id}/modules/{module_id}")
}

/// The exact bytes the key signs.
pub fn string_to_sign(resource: &str, expires_at: u64) -> String {
    format!("{}\n{expires_at}", encode(resource))
}

/// Assemble a token from a raw HMAC digest.
pub fn token(resource: &str, expires_at: u64, digest: &[u8]) -> String {
    let sig = base64::engine::general_purpose::STANDARD.encode(digest);
    format!(
        "SharedAccessSignature sr={}&sig={}&se={expires_at}",
        encode(resource),
        encode(&sig)
    )
}

/// Sign a token for `resource`, valid until `expires_at`, through the workload API.
///
/// # Errors
/// The workload API refused or failed.
pub async fn sign(
    workload: &WorkloadClient,
    resource: &str,
    expires_at: u64,
) -> Result<SasToken, WorkloadError> {
    let digest = workload
        .sign(string_to_sign(resource, expires_at).as_bytes())
        .await?;
    Ok(SasToken {
        token: token(resource, expires_at, &digest),
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_matches_a_locally_computed_hmac() {
        // What the workload API computes with the module key, done here with ring.
        let key_bytes = b"0123456789abcdef0123456789abcdef";
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key_bytes);
        let res = resource("myhub.azure-devices.net", "edge-dev-1", "gridlet");
        let sts = string_to_sign(&res, 1_700_000_000);
        assert_eq!(
            sts,
            "myhub.azure-devices.net%2Fdevices%2Fedge-dev-1%2Fmodules%2Fgridlet\n1700000000"
        );
        let digest = ring::hmac::sign(&key, sts.as_bytes());
        let t = token(&res, 1_700_000_000, digest.as_ref());
        let sig = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
        assert_eq!(
            t,
            format!(
                "SharedAccessSignature sr=myhub.azure-devices.net%2Fdevices%2Fedge-dev-1%2Fmodules%2Fgridlet&sig={}&se=1700000000",
                encode(&sig)
            )
        );
        let encoded_sig = t
            .split("&sig=")
            .nth(1)
            .and_then(|r| r.split("&se=").next())
            .unwrap();
        assert!(!encoded_sig.contains(['+', '/', '=']), "{encoded_sig}");
        let dbg = format!(
            "{:?}",
            SasToken {
                token: t,
                expires_at: 1
            }
        );
        assert!(!dbg.contains("SharedAccessSignature"));
    }
}
