//! # gridlet
//!
//! A lightweight, durable event broker that runs as an Azure IoT Edge module: a drop-in
//! replacement for the retired *Event Grid on IoT Edge* module (same REST API, settings and
//! deployment shape), with durable queues, delivery resilience and a small footprint.
//!
//! Where an event flows (see `docs/ARCHITECTURE.md`):
//!
//! ```text
//! server (listeners, TLS) ─► api (auth, api-version, body limit) ─► model::event (parse, validate)
//!   ─► broker::publish (route, admit = reserve places, persist, enqueue)
//!   ─► delivery::subscription::SubscriptionHandle ─► delivery::dispatcher (one task each)
//!   ─► delivery::sink::Sink ─► outbound (webhook, Event Grid, edgeHub, Azure messaging)
//!   ─► delivery::settle (pure: retry::next_step per event) ─► Effects ─► delivery::apply
//!      (queue, retry lane, dead letters; store writes: delivery::writer)
//! ```
//!
//! * `config`: the one typed configuration, from the environment.
//! * `api`: HTTP routes and the single auth check; `error`: the only error→HTTP table.
//! * `model`: topics, subscriptions (with their filters), events, destinations; `policy`: retry
//!   schedules and status-code policies as data.
//! * `broker`: registry and publish path; `delivery`: queues, dispatch, retry, pull (the
//!   engine); `outbound`: the destinations behind its `Sink` seam (HTTP, Azure, edgeHub).
//! * `store`: storage trait and implementations; `tls`: certificates and verifiers.
//! * `edge`: running as an IoT Edge module (workload API, edgeHub, module twin).
//! * `ingress`: MQTT sources (messages from MQTT brokers become published events).
//! * `metrics`: counters and the one table of families; `clock`: time seam.
//! * `telemetry`: OpenTelemetry trace context, spans and their OTLP export.
//!
//! The crate exports only what the binary, the benchmark and the tests use; everything else is
//! `pub(crate)`, so the compiler reports what nothing uses.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub(crate) mod api;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod edge;
pub(crate) mod error;
pub mod ingress;
pub(crate) mod metrics;
pub mod model;
pub mod outbound;
pub(crate) mod policy;
pub(crate) mod redact;
pub mod server;
pub mod store;
pub mod sync;
pub(crate) mod telemetry;
pub mod tls;

pub use config::Config;
pub use server::{Gridlet, Parts};
