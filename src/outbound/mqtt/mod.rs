//! MQTT, shared by both directions: gridlet as an MQTT client of a broker it does not run
//! (Mosquitto, Azure IoT Operations' broker, any MQTT 5 or 3.1.1 broker).
//!
//! * [`connection`]: one broker connection as plain data ([`connection::ConnectionSpec`]: URL,
//!   client id, protocol version, TLS, credentials, session), the rumqttc options made from it,
//!   and the jittered reconnect back-off. The MQTT sources (messages become events) and the MQTT
//!   destination (events become messages) both build their clients from it.

pub mod connection;
