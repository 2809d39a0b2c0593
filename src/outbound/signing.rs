//! Standard Webhooks signing (opt-in per subscription): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature` headers, HMAC-SHA256 over `{id}.{timestamp}.{body}` with `whsec_`
//! secrets. Several secrets sign side by side (`v1,<a> v1,<b>`) so keys rotate without downtime.
//!
//! Secrets are held as [`ring::hmac::Key`]s and never printed: [`Signer`]'s `Debug` shows only
//! how many there are.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::hmac;

pub use crate::model::signing_secret::{decode_secret, SecretError, SECRET_BYTES};

/// Signs with one or more secrets.
#[derive(Clone)]
pub struct Signer {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({} secrets)", self.keys.len())
    }
}

impl Signer {
    /// A signer from `whsec_` secrets.
    ///
    /// # Errors
    /// The first invalid secret.
    pub fn new<S: AsRef<str>>(secrets: &[S]) -> Result<Self, SecretError> {
        let keys = secrets
            .iter()
            .map(|s| decode_secret(s.as_ref()).map(|b| hmac::Key::new(hmac::HMAC_SHA256, &b)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { keys })
    }

    /// The `webhook-signature` value: `v1,<base64>` per secret, space separated.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        self.keys
            .iter()
            .map(|k| {
                let mut ctx = hmac::Context::with_key(k);
                ctx.update(id.as_bytes());
                ctx.update(b".");
                ctx.update(ts.as_bytes());
                ctx.update(b".");
                ctx.update(body);
                format!("v1,{}", STANDARD.encode(ctx.sign().as_ref()))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TS: u64 = 1_649_367_553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const EXPECTED: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    #[test]
    fn standard_webhooks_test_vector() {
        let s = Signer::new(&[SECRET]).unwrap();
        assert_eq!(s.sign(ID, TS, BODY), EXPECTED);
    }

    #[test]
    fn several_secrets_sign_side_by_side_for_rotation() {
        let other = format!("whsec_{}", STANDARD.encode([7u8; 32]));
        let s = Signer::new(&[other.as_str(), SECRET]).unwrap();
        let sig = s.sign(ID, TS, BODY);
        let parts: Vec<&str> = sig.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], EXPECTED);
        assert_ne!(parts[0], EXPECTED);
    }

    #[test]
    fn bad_secrets_are_named_not_echoed() {
        assert_eq!(decode_secret("C2FVsBQI").unwrap_err(), SecretError::Prefix);
        assert_eq!(decode_secret("whsec_!!!").unwrap_err(), SecretError::Base64);
        assert_eq!(
            decode_secret("whsec_AAAA").unwrap_err(),
            SecretError::Length
        );
        let s = Signer::new(&[SECRET]).unwrap();
        assert!(!format!("{s:?}").contains("C2FV"));
    }
}
