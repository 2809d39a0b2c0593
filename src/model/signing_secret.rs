//! Standard Webhooks signing secrets (`whsec_<base64>`) as a subscription states them: what a
//! valid one is. Signing with them is delivery's (`crate::outbound::signing`).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// Smallest and largest accepted secret, in decoded bytes (the spec: 24–64).
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A secret that is not a valid `whsec_` secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Missing prefix.
    #[error("signing secrets must start with whsec_")]
    Prefix,
    /// Not base64.
    #[error("the text after whsec_ must be standard base64")]
    Base64,
    /// Wrong length.
    #[error("signing secrets must decode to 24 to 64 bytes")]
    Length,
}

/// Decode a `whsec_` secret into its key bytes.
///
/// # Errors
/// [`SecretError`] naming what is wrong (never the secret itself).
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, SecretError> {
    let b64 = secret
        .trim()
        .strip_prefix("whsec_")
        .ok_or(SecretError::Prefix)?;
    let bytes = STANDARD.decode(b64).map_err(|_| SecretError::Base64)?;
    if !SECRET_BYTES.contains(&bytes.len()) {
        return Err(SecretError::Length);
    }
    Ok(bytes)
}
