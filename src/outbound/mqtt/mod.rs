//! MQTT, shared by both directions: gridlet as an MQTT client of a broker it does not run
//! (Mosquitto, Azure IoT Operations' broker, any MQTT 5 or 3.1.1 broker).
//!
//! * [`connection`]: one broker connection as plain data ([`connection::ConnectionSpec`]: URL,
//!   client id, protocol version, TLS, credentials, session) and the rumqttc options made
//!   from it. The MQTT sources (messages become events) and the MQTT destination (events
//!   become messages) both build their clients from it.
//! * [`backoff`]: the jittered reconnect back-off (also `connection::Backoff`).

pub mod acks;
pub mod backoff;
pub mod connection;

// The destination: events become messages (`outbound::sinks::mqtt` is its registry entry).
// * [`topic`]: the topic template filled from each event.
// * [`publish`]: one shared publishing connection per broker and credentials, PUBACKs matched
//   to their publishes.
// * [`sink`]: the `Sink` (one message per event, MQTT 5 properties, the reason-code split).
pub mod publish;
pub mod sink;
pub mod topic;
