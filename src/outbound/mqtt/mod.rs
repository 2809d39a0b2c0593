//! MQTT, shared by both directions: gridlet as an MQTT client of a broker it does not run
//! (Mosquitto, Azure IoT Operations' broker, any MQTT 5 or 3.1.1 broker).
//!
//! * [`connection`]: one broker connection as plain data ([`connection::ConnectionSpec`]: URL,
//!   client id, protocol version, TLS, credentials, session) and the rumqttc options made
//!   from it. The MQTT sources (messages become events) and the MQTT destination (events
//!   become messages) both build their clients from it.
//! * [`backoff`]: the jittered reconnect back-off (also `connection::Backoff`).

pub mod backoff;
pub mod connection;
