//! Topic and subscription names.
//!
//! The edge never documented its rules; gridlet accepts `[A-Za-z0-9_-]{1,64}` (a superset of every
//! name in the docs and samples, and of cloud Event Grid's rules), compares names
//! case-insensitively and keeps the original casing in output.

use super::Invalid;

/// Longest name.
pub const MAX_NAME_LEN: usize = 64;

/// Check a topic or subscription name.
///
/// # Errors
/// [`Invalid`] `InvalidName` naming the rule.
pub fn validate(kind: &str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "InvalidName",
            format!(
                "{kind} name must be 1 to {MAX_NAME_LEN} characters of A-Z, a-z, 0-9, '-' and '_'"
            ),
        ))
    }
}

/// The lookup key of a name (names are case-insensitive).
pub fn key(name: &str) -> String {
    name.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        assert!(validate("topic", "sampleTopic1").is_ok());
        assert!(validate("topic", "MicrosoftStorage").is_ok());
        assert!(validate("topic", "a_b-c").is_ok());
        assert!(validate("topic", "").is_err());
        assert!(validate("topic", "has space").is_err());
        assert!(validate("topic", "dots.are.out").is_err());
        assert!(validate("topic", &"x".repeat(65)).is_err());
    }
}
