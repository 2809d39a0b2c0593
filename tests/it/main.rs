//! Black-box tests: a real gridlet over HTTP, real webhook receivers, real protocol peers.

// The tests are the broker's clients and peers: the system's wall time is theirs to read
// (clippy.toml keeps it out of the broker, behind the clock seam).
#![allow(clippy::disallowed_methods)]

mod api;
mod azure;
mod azure_eventgrid;
mod bench_smoke;
mod bus_peer;
mod child;
mod cloud;
mod compaction;
mod console;
mod crash;
mod credentials;
mod damage;
mod dedup;
mod dedup_process;
mod delivery;
mod docs;
mod durable_resilience;
mod edge;
mod entra;
mod entra_refresh;
mod fuzz;
mod harness;
mod health_isolation;
mod layering;
mod management;
mod meta_upgrade;
mod mosquitto;
mod mqtt_api;
mod mqtt_api_limits;
mod mqtt_out;
mod mqtt_process;
mod mqtt_sdk;
mod mqtt_secrets;
mod mqtt_source;
mod namespaces_push;
mod node;
mod ns_peer;
mod otel;
mod outage;
mod outbound;
mod packaging;
mod pending_bytes;
mod persistence;
mod process;
mod pull;
mod pull_auth;
mod pull_clock;
mod pull_power_cut;
mod pull_process;
mod pull_sdk;
mod records;
mod resilience;
mod schedule;
mod secrets;
mod security;
mod trust;
mod trust_budgets;
mod trust_limits;
mod util;
mod wait;
mod walkthroughs;
