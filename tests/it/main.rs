//! Black-box tests: a real gridlet over HTTP, real webhook receivers.

mod api;
mod crash;
mod persistence;
mod util;
