//! Outbound protocols: every destination gridlet delivers to, behind the delivery engine's
//! [`Sink`](crate::delivery::sink::Sink) seam. The engine (`crate::delivery`: queues,
//! dispatcher, settle, retry, pull) knows only `Sink`; this room knows the wire.
//!
//! * [`sinks`]: the destination types (one file each), the `DESTINATIONS` registry that parses
//!   them and builds their sinks.
//! * [`post`]: HTTP destinations (batching, Event Grid's headers, signing), over [`http`]
//!   (gridlet's own pooled HTTP/1.1 client, with the denied-address check).
//! * [`signing`]: Standard Webhooks signatures.
//! * [`azure`]: Event Hubs, Service Bus, Storage queue and blob dead-letter sinks.
//! * [`mqtt`]: broker connections (shared with the MQTT sources, which sit above the broker).

pub mod azure;
pub mod http;
pub(crate) mod mqtt;
pub mod post;
pub mod signing;
pub mod sinks;
