//! The model's one error: a request it cannot accept.
//!
//! Every parse and validation in the model answers [`Invalid`]: a stable code (the documented
//! `details.code` on the wire, e.g. `InvalidSchema`, `InvalidDestination`) and a message naming
//! the field. The model knows nothing of HTTP: the API's error table turns an `Invalid` into a
//! 400 with the documented body.

use std::fmt;

/// A request the model rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Stable code, e.g. `InvalidFilter`.
    pub code: &'static str,
    /// Human-readable message naming the field.
    pub message: String,
}

impl Invalid {
    /// A rejection with its code and message.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Invalid {}
