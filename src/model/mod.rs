//! The data model: what the API accepts and echoes, and what the engine routes.
//!
//! * [`topic`]: schemas and the topic resource.
//! * [`subscription`]: destinations, retry/batching/persistence policies, the subscription resource.
//! * [`record`]: what the metadata store keeps of topics and subscriptions (typed, versioned).
//! * [`event`]: publish-request parsing and validation for the three schemas.
//! * [`json`]: case-insensitive reading of management bodies.
//! * [`names`]: name rules.
//! * [`azure`]: Azure connection strings and storage resource names.
//! * [`invalid`]: the model's one error, [`Invalid`] (a code and a message; no HTTP).

pub(crate) mod attributes;
pub mod azure;
pub(crate) mod delivery_options;
pub mod destination;
pub mod event;
pub(crate) mod filter;
pub(crate) mod invalid;
pub(crate) mod json;
pub(crate) mod media;
pub(crate) mod names;
pub(crate) mod queue;
pub(crate) mod reason;
pub mod record;
pub(crate) mod sas;
pub(crate) mod signing_secret;
pub mod subscription;
pub mod topic;

pub use invalid::Invalid;
