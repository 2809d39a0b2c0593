//! The gridlet binary: read the configuration, start, wait for SIGTERM or Ctrl-C, stop.

#![forbid(unsafe_code)]

use gridlet::{Config, Gridlet, Parts};
use std::process::ExitCode;

/// mimalloc instead of the platform allocator: glibc's malloc/free were a quarter of the
/// instructions per delivered event (callgrind, docs/BENCHMARKS.md; musl's are slower still), and
/// after a 1M-event backlog drains mimalloc gives the memory back (72–459 MB RSS right after,
/// falling as it purges) where glibc kept all 700 MB. `.cargo/config.toml` turns off its eager
/// arena commit, which otherwise doubles idle RSS. Binary only: the library and its tests keep the
/// system allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gridlet: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .init();
    for k in &cfg.unknown_keys {
        tracing::warn!(key = %k, "unknown setting ignored (check its spelling)");
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if cfg.broker.worker_threads > 0 {
        runtime.worker_threads(cfg.broker.worker_threads);
    }
    let rt = match runtime.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gridlet: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        let gridlet = match Gridlet::start(cfg, Parts::default()).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gridlet: {e}");
                return ExitCode::from(1);
            }
        };
        shutdown_signal().await;
        tracing::info!("shutting down");
        gridlet.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
