//! Black-box tests: a real gridlet over HTTP, real webhook receivers.

mod api;
mod delivery;
mod fuzz;
mod process;
mod schedule;
mod security;
mod util;
