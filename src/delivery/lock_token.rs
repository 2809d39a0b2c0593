//! Lock tokens: what a receiver gets with each event and hands back to settle it.
//!
//! A token names `(queue, sequence number, attempt)`, the subscription's store queue, the event
//! and the receive that locked it, and carries an HMAC-SHA256 tag (truncated to 128 bits) under
//! a key drawn at random when gridlet starts (one for all subscriptions). So a token cannot be forged or altered, a token
//! from before a redelivery names an older attempt and is refused as lost, a token of another
//! subscription names another queue, and tokens from before a restart are refused as lost (the
//! key is gone with the process; their events come back when their locks expire). A token
//! whose tag does not verify is answered as lost, not as malformed: a restart is the usual
//! reason, and a forger learns nothing either way.
//!
//! Wire form: base64url without padding of `queue (4) | seq (8) | attempt (4) | tag (16)`, 43
//! characters.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;

/// Bytes of the tag kept.
const TAG: usize = 16;
/// Bytes of the named part.
const BODY: usize = 16;
/// Characters of a token on the wire (base64url without padding of [`BODY`] + [`TAG`] bytes).
pub const TOKEN_LEN: usize = ((BODY + TAG) * 4).div_ceil(3);

/// What a token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId {
    /// The subscription's store queue.
    pub queue: u32,
    /// The event's sequence number.
    pub seq: u64,
    /// The receive (attempt number, = the `deliveryCount` it was delivered with).
    pub attempt: u32,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a token's shape at all.
    Malformed,
    /// A token's shape whose tag this key did not make: from before a restart (or forged).
    Unverified,
}

/// The process's token key.
pub struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A fresh random key.
    pub fn random() -> Self {
        let rng = ring::rand::SystemRandom::new();
        // Generating an HMAC key fails only when the OS has no randomness; a fixed key would
        // make tokens forgeable, so fall back to a key from the time and address space at
        // least (never expected on Linux).
        match hmac::Key::generate(hmac::HMAC_SHA256, &rng) {
            Ok(k) => Self(k),
            Err(_) => {
                let seed = format!("{:?}{:p}", std::time::Instant::now(), &rng);
                Self(hmac::Key::new(hmac::HMAC_SHA256, seed.as_bytes()))
            }
        }
    }

    /// The token for `id`.
    pub fn issue(&self, id: TokenId) -> String {
        let mut buf = [0u8; BODY + TAG];
        buf[..4].copy_from_slice(&id.queue.to_be_bytes());
        buf[4..12].copy_from_slice(&id.seq.to_be_bytes());
        buf[12..16].copy_from_slice(&id.attempt.to_be_bytes());
        let tag = hmac::sign(&self.0, &buf[..BODY]);
        buf[BODY..].copy_from_slice(&tag.as_ref()[..TAG]);
        URL_SAFE_NO_PAD.encode(buf)
    }

    /// What `token` names, if it is one this key issued.
    ///
    /// # Errors
    /// [`Refused`]: malformed, or not issued under this key.
    pub fn open(&self, token: &str) -> Result<TokenId, Refused> {
        if token.len() > 64 {
            return Err(Refused::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(token.trim())
            .map_err(|_| Refused::Malformed)?;
        if raw.len() != BODY + TAG {
            return Err(Refused::Malformed);
        }
        let (body, tag) = raw.split_at(BODY);
        let want = hmac::sign(&self.0, body);
        // Constant time: the tag decides, not where it first differs.
        let diff = want.as_ref()[..TAG]
            .iter()
            .zip(tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(Refused::Unverified);
        }
        let u32_at = |i: usize| body.get(i..i + 4)?.try_into().ok().map(u32::from_be_bytes);
        let seq = body
            .get(4..12)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        match (u32_at(0), seq, u32_at(12)) {
            (Some(queue), Some(seq), Some(attempt)) => Ok(TokenId {
                queue,
                seq,
                attempt,
            }),
            _ => Err(Refused::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_resist_forgery() {
        let k = TokenKey::random();
        let id = TokenId {
            queue: 7,
            seq: 1 << 40,
            attempt: 3,
        };
        let t = k.issue(id);
        assert_eq!(t.len(), 43);
        assert_eq!(TOKEN_LEN, 43);
        assert_eq!(k.open(&t), Ok(id));
        // Another process's key, a flipped character: unverified; junk: malformed.
        assert_eq!(TokenKey::random().open(&t), Err(Refused::Unverified));
        let mut flipped = t.clone().into_bytes();
        flipped[3] = if flipped[3] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            k.open(&String::from_utf8(flipped).unwrap()),
            Err(Refused::Unverified)
        );
        for junk in ["", "x", "CgMKATESCQoHdG9rZW4tMQ==", &"A".repeat(500)] {
            assert_eq!(k.open(junk), Err(Refused::Malformed));
        }
    }
}
