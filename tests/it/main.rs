//! Black-box tests: a real gridlet over HTTP, real webhook receivers, real protocol peers.

mod api;
mod azure;
mod bench_smoke;
mod crash;
mod delivery;
mod durable_resilience;
mod edge;
mod fuzz;
mod harness;
mod health_isolation;
mod layering;
mod management;
mod node;
mod otel;
mod outbound;
mod packaging;
mod persistence;
mod process;
mod resilience;
mod schedule;
mod secrets;
mod security;
mod util;
mod wait;
