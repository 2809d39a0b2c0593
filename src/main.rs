//! The gridlet binary: read the configuration, start, wait for SIGTERM or Ctrl-C, stop.

// One audited `unsafe` call (setting an allocator option, `tune_allocator`); the library
// forbids unsafe code outright.
#![deny(unsafe_code)]

use gridlet::cli::{self, Command};
use gridlet::config::Key;
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

/// How long memory freed back to mimalloc stays resident before it goes back to the OS (ms).
/// mimalloc v3's default, 1,000 ms (×10 for its arenas), keeps transients resident, such as
/// the index a restart reads for a persisted backlog: with 1,000,000 retrying events, RSS right
/// after the restart was 166 MB and the drain peaked at 166 MB; with 10 ms, 106 MB and 145 MB
/// (docs/BENCHMARKS.md). A `MIMALLOC_PURGE_DELAY` in the environment wins.
const PURGE_DELAY_MS: std::os::raw::c_long = 10;

/// `mi_option_purge_delay`'s place in mimalloc v3's `mi_option_t` (`include/mimalloc.h`);
/// `libmimalloc-sys` 0.1.49 names no constant for it. The test below checks it against the
/// option's documented default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Set gridlet's allocator options, before any thread starts.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table; the index is a
    // valid option (checked by `purge_delay_option_index_is_mimallocs`), and no other thread
    // exists yet.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
}

fn main() -> ExitCode {
    tune_allocator();
    let command = match cli::parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gridlet: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(code) = answer(command) {
        return code;
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gridlet: {e}");
            return ExitCode::from(2);
        }
    };
    // The MQTT sources' settings, checked as `check-config` does (files and topics at start).
    if let Err(e) = gridlet::ingress::plan(&cfg).and_then(|p| gridlet::ingress::check_files(&p)) {
        eprintln!("gridlet: {e}");
        return ExitCode::from(2);
    }
    cli::init_logging(cfg.log_format);
    cli::log_start(std::env::vars().collect());
    if let Err(line) = data_dirs_writable(&cfg) {
        eprintln!("gridlet: {line}");
        return ExitCode::from(1);
    }
    for u in &cfg.unknown_keys {
        match u.closest {
            Some(k) => tracing::warn!(
                key = %u.key,
                closest = k.name(),
                "unknown setting ignored: did you mean {}?",
                k.name()
            ),
            None => tracing::warn!(key = %u.key, "unknown setting ignored (check its spelling)"),
        }
    }
    for w in cfg.warnings() {
        tracing::warn!("{w}");
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
        // Listen for SIGTERM before anything is served: a signal that arrives while start-up
        // finishes must stop gridlet cleanly, not kill it with the default action.
        let shutdown = shutdown_signal();
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(worker_threads = workers, "async runtime started");
        let gridlet = match Gridlet::start(cfg, Parts::default()).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gridlet: {e}");
                return ExitCode::from(1);
            }
        };
        shutdown.await;
        tracing::info!("shutting down");
        gridlet.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// The commands that answer and exit instead of running the broker (`None`: run it).
fn answer(command: Command) -> Option<ExitCode> {
    match command {
        Command::Run => None,
        Command::Help => {
            print!("{}", cli::help());
            Some(ExitCode::SUCCESS)
        }
        Command::Version => {
            println!("{}", cli::version());
            Some(ExitCode::SUCCESS)
        }
        Command::CheckConfig { manifest, module } => {
            let vars = match manifest {
                Some(path) => match cli::manifest_env(&path, module.as_deref()) {
                    Ok(vars) => vars,
                    Err(e) => {
                        eprintln!("gridlet: {e}");
                        return Some(ExitCode::from(2));
                    }
                },
                None => std::env::vars().collect(),
            };
            let (out, code) = cli::check_config(vars);
            print!("{out}");
            Some(ExitCode::from(code))
        }
        Command::Healthcheck => Some(healthcheck()),
    }
}

/// `gridlet healthcheck`: exit 0 when the local `/healthz` answers 200, else 1.
fn healthcheck() -> ExitCode {
    let outcome = Config::from_env()
        .map_err(|e| e.to_string())
        .and_then(|cfg| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(cli::healthcheck(&cfg))
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gridlet: unhealthy: {e}");
            ExitCode::from(1)
        }
    }
}

/// The data directories are often host directories bind-mounted into the container, and the
/// module runs as UID 2000: when one is not writable for this process, say in one line what to
/// change on the host, instead of a store error that reads like corruption.
fn data_dirs_writable(cfg: &Config) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if cfg.persistence.store == gridlet::config::StoreKind::Memory {
        return Ok(());
    }
    let dirs = [
        (
            &cfg.persistence.metadata_path,
            Key::persistence__metadataPath.name(),
        ),
        (
            &cfg.persistence.events_path,
            Key::persistence__eventsPath.name(),
        ),
    ];
    for (dir, setting) in dirs {
        let probe = dir.join(".gridlet-write-check");
        let result = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&probe, b""))
            .and_then(|()| std::fs::remove_file(&probe));
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                // /proc/self belongs to the process's effective user.
                let uid = std::fs::metadata("/proc/self").map_or(2000, |m| m.uid());
                return Err(format!(
                    "cannot write {} ({setting}) as UID {uid}: give the directory to that user \
                     on the host, e.g. `sudo chown -R {uid}:{uid} <the host directory mounted there>`",
                    dir.display()
                ));
            }
            // Anything else (a file in the way, a full disk) is reported by the store as it opens.
            _ => {}
        }
    }
    Ok(())
}

/// Resolves on SIGTERM (how IoT Edge and container runtimes stop a module) or Ctrl-C. The
/// handlers are installed when this is called, not when the future is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let ctrl_c = tokio::signal::ctrl_c();
    async move {
        #[cfg(unix)]
        let term = async {
            match term {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            r = ctrl_c => if r.is_err() { std::future::pending::<()>().await },
            _ = term => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option at [`MI_OPTION_PURGE_DELAY`] is the purge delay: it holds v3's documented
    /// default (1,000 ms) until set, and takes the value set. Run under the binary's global
    /// allocator (mimalloc).
    #[test]
    #[allow(unsafe_code)]
    fn purge_delay_option_index_is_mimallocs() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading and setting an option of mimalloc's table, by a valid index.
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            before, 1000,
            "mimalloc's option table moved: fix MI_OPTION_PURGE_DELAY"
        );
        tune_allocator();
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(after, PURGE_DELAY_MS);
    }
}
