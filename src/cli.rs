//! The binary's command line and its log output.
//!
//! `gridlet` alone runs the broker, configured by the environment as the original module was.
//! Besides: `--help` (usage and every setting with its default), `--version`, `check-config`
//! (validate the environment, or a deployment manifest's `env` for the module, and print the
//! effective settings with secrets masked; exit 0 or 2) and `healthcheck` (GET `/healthz` on the
//! local listener; exit 0 or 1, for a container `HEALTHCHECK` in an image without curl).
//!
//! Four words need no argument-parsing crate: matching them by hand costs nothing in the binary,
//! where lexopt would add a little and clap several hundred KiB to a 6 MB program.

use crate::config::{self, Config, LogFormat, TlsPolicy};
use crate::outbound::http::HttpClient;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Run the broker.
    Run,
    /// Print usage and the settings.
    Help,
    /// Print the version and build target.
    Version,
    /// Validate the environment (or a manifest's `env` for one module) and print the settings.
    CheckConfig {
        /// A deployment manifest to read the module's `env` from instead of the environment.
        manifest: Option<PathBuf>,
        /// The module to read (default: the one whose image names gridlet, else `gridlet`).
        module: Option<String>,
    },
    /// GET `/healthz` on the local listener.
    Healthcheck,
}

/// Read the arguments after the program name.
///
/// # Errors
/// An unknown command or option, with the usage line.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let args: Vec<String> = args.into_iter().collect();
    let usage = || format!("usage: {USAGE}");
    match args.first().map(String::as_str) {
        None => Ok(Command::Run),
        Some("-h" | "--help" | "help") => Ok(Command::Help),
        Some("-V" | "--version") => Ok(Command::Version),
        Some("healthcheck") if args.len() == 1 => Ok(Command::Healthcheck),
        Some("check-config") => {
            let (mut manifest, mut module) = (None, None);
            let mut rest = args[1..].iter();
            while let Some(a) = rest.next() {
                match a.as_str() {
                    "--manifest" => manifest = rest.next().map(PathBuf::from),
                    "--module" => module = rest.next().cloned(),
                    other => return Err(format!("unknown option {other:?}; {}", usage())),
                }
            }
            if module.is_some() && manifest.is_none() {
                return Err(format!("--module goes with --manifest; {}", usage()));
            }
            Ok(Command::CheckConfig { manifest, module })
        }
        Some(other) => Err(format!("unknown command {other:?}; {}", usage())),
    }
}

const USAGE: &str =
    "gridlet [--help | --version | check-config [--manifest FILE [--module NAME]] | healthcheck]";

/// `gridlet 0.1.0 (x86_64-linux-gnu)`.
pub fn version() -> String {
    let env = if cfg!(target_env = "gnu") {
        "-gnu"
    } else if cfg!(target_env = "musl") {
        "-musl"
    } else {
        ""
    };
    format!(
        "gridlet {} ({}-{}{env})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// Usage, commands and every setting with its default.
pub fn help() -> String {
    let mut out = format!(
        "{}\nA durable event broker for Azure IoT Edge, compatible with Event Grid on IoT Edge.\n\n\
         usage: {USAGE}\n\n\
         (no command)   run the broker, configured by the environment\n\
         check-config   validate the settings (a misspelled one names the closest key) and print\n\
         \x20              them, secrets masked; exit 0 or 2\n\
         healthcheck    GET /healthz on the local listener; exit 0 or 1\n\n\
         Settings (environment variables; `__` or `:` separators, case-insensitive):\n",
        version()
    );
    for s in config::SETTINGS {
        let default = if s.default.is_empty() {
            "(unset)"
        } else {
            s.default
        };
        let _ = writeln!(out, "  {} = {}\n      {}", s.key, default, s.doc);
    }
    out
}

/// `check-config`: the text to print and the exit code (0 valid, 2 not). Not valid: a value that
/// does not parse, or a variable that looks like a misspelled setting (the broker would ignore
/// it and run with the default), named with the closest key.
pub fn check_config(vars: Vec<(String, String)>) -> (String, u8) {
    let mut out = String::new();
    let parsed = Config::from_vars(vars.clone());
    if let Err(e) = &parsed {
        let _ = writeln!(out, "gridlet: {e}");
    }
    let unknown = config::unknown_keys(vars.clone());
    for u in &unknown {
        let _ = writeln!(out, "gridlet: unknown setting {u}");
    }
    if !unknown.is_empty() {
        let _ = writeln!(
            out,
            "gridlet: the broker ignores unknown settings and uses the defaults: fix or remove them"
        );
    }
    let cfg = match parsed {
        Ok(cfg) if unknown.is_empty() => cfg,
        _ => return (out, 2),
    };
    if let Err(e) = crate::ingress::plan(&cfg).and_then(|p| crate::ingress::check_files(&p)) {
        let _ = writeln!(out, "gridlet: {e}");
        return (out, 2);
    }
    for w in cfg.warnings() {
        let _ = writeln!(out, "warning: {w}");
    }
    out.push_str("configuration is valid; settings in force (* = set):\n");
    for e in config::effective(vars) {
        let mark = if e.given { '*' } else { ' ' };
        let _ = writeln!(out, "{mark} {} = {}", e.key, e.value);
    }
    (out, 0)
}

/// The `env` a deployment manifest gives one module: its `env` object (`{"KEY": {"value": ..}}`)
/// and the `Env` list of its `createOptions` (`["KEY=value"]`, as the original's samples).
///
/// # Errors
/// The file cannot be read or is not a manifest with that module.
pub fn manifest_env(
    path: &std::path::Path,
    module: Option<&str>,
) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let modules = doc
        .pointer("/modulesContent/$edgeAgent/properties.desired/modules")
        .and_then(|m| m.as_object())
        .ok_or_else(|| format!("{}: no modulesContent.$edgeAgent modules", path.display()))?;
    let names_gridlet = |m: &serde_json::Value| {
        m.pointer("/settings/image")
            .and_then(|i| i.as_str())
            .is_some_and(|i| i.to_ascii_lowercase().contains("gridlet"))
    };
    let (name, m) = match module {
        Some(name) => modules.get_key_value(name),
        None => modules
            .iter()
            .find(|(_, m)| names_gridlet(m))
            .or_else(|| modules.get_key_value("gridlet")),
    }
    .ok_or_else(|| format!("{}: no such module", path.display()))?;
    let mut vars = Vec::new();
    if let Some(env) = m.get("env").and_then(|e| e.as_object()) {
        for (k, v) in env {
            let value = v.get("value").unwrap_or(v);
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            vars.push((k.clone(), value));
        }
    }
    let create = m.pointer("/settings/createOptions");
    let create = match create {
        Some(serde_json::Value::String(s)) => serde_json::from_str(s).ok(),
        other => other.cloned(),
    };
    if let Some(list) = create
        .as_ref()
        .and_then(|c| c.get("Env"))
        .and_then(|e| e.as_array())
    {
        for kv in list.iter().filter_map(|v| v.as_str()) {
            if let Some((k, v)) = kv.split_once('=') {
                vars.push((k.to_string(), v.to_string()));
            }
        }
    }
    if vars.is_empty() {
        return Err(format!(
            "{}: module {name} sets no environment",
            path.display()
        ));
    }
    Ok(vars)
}

/// `healthcheck`: GET `/healthz` on this configuration's local listener (HTTP when it runs, else
/// HTTPS without checking the certificate: this is the module's own).
///
/// # Errors
/// No answer within 5 s, or a status other than 200.
pub async fn healthcheck(cfg: &Config) -> Result<(), String> {
    let local = if cfg.inbound.bind_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        cfg.inbound.bind_address.to_string()
    };
    let host = if local.contains(':') {
        format!("[{local}]")
    } else {
        local
    };
    let url = if cfg.inbound.tls_policy == TlsPolicy::Strict {
        format!("https://{host}:{}/healthz", cfg.inbound.https_port)
    } else {
        format!("http://{host}:{}/healthz", cfg.inbound.http_port)
    };
    crate::tls::install_default_provider();
    let tls = crate::tls::client_config(&crate::tls::OutboundTls {
        accept_any_server_cert: true,
        extra_roots_pem: None,
        identity: None,
    })
    .map_err(|e| e.to_string())?;
    let client = HttpClient::new(tls, Duration::from_secs(5));
    let endpoint = client.endpoint(&url).map_err(|e| e.to_string())?;
    let resp = endpoint
        .send(
            hyper::Method::GET,
            hyper::HeaderMap::new(),
            bytes::Bytes::new(),
        )
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if resp.status == hyper::StatusCode::OK {
        Ok(())
    } else {
        Err(format!("{url}: {}", resp.status))
    }
}

/// Set up logging per `log__format`: text lines with the syslog severity prefix (colours only
/// on a terminal, never with `NO_COLOR`), or JSON lines. Level from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // The filter sits right on the registry, so it alone decides the level (`fmt()`'s builder
    // would add its own, `info`, that no `RUST_LOG` could raise).
    let logs =
        tracing_subscriber::registry().with(log_filter(std::env::var("RUST_LOG").ok().as_deref()));
    match format {
        LogFormat::Json => logs.with(fmt::layer().with_target(false).json()).init(),
        LogFormat::Text => {
            let ansi = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            let text = fmt::format().with_target(false).with_ansi(ansi);
            logs.with(
                fmt::layer()
                    .with_ansi(ansi)
                    .event_format(SyslogPrefix(text)),
            )
            .init();
        }
    }
}

/// `RUST_LOG` as a list of `target=level` directives and an optional bare default level
/// (`info`, `debug,sled=info`); unset or not understood: `info`. This is tracing-subscriber's
/// `Targets`, not `EnvFilter`: the span and field directives of `EnvFilter` (`[span{f=v}]=debug`)
/// are not understood, and leaving them out drops the regex engine from the binary
/// (docs/BENCHMARKS.md, "Footprint").
fn log_filter(var: Option<&str>) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    var.filter(|v| !v.trim().is_empty())
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

/// Log, once at start, what is running and every setting that differs from its default.
pub fn log_start(vars: Vec<(String, String)>) {
    let changed: Vec<String> = config::effective(vars)
        .into_iter()
        .filter(|e| e.given && e.value != e.setting.default)
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    tracing::info!(version = %version(), settings = %changed.join(" "), "gridlet starting");
}

/// Writes `<N> ` (the syslog severity: 3 error, 4 warning, 6 info, 7 debug) before each record,
/// which `iotedge logs` and IoT Edge's log upload filter on, then the record as `F` formats it.
struct SyslogPrefix<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for SyslogPrefix<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let severity = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{severity}> ")?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Command, String> {
        parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn commands_parse_and_unknown_ones_are_refused() {
        assert_eq!(args(&[]), Ok(Command::Run));
        assert_eq!(args(&["--help"]), Ok(Command::Help));
        assert_eq!(args(&["-V"]), Ok(Command::Version));
        assert_eq!(args(&["healthcheck"]), Ok(Command::Healthcheck));
        assert_eq!(
            args(&["check-config", "--manifest", "m.json", "--module", "eg"]),
            Ok(Command::CheckConfig {
                manifest: Some("m.json".into()),
                module: Some("eg".into())
            })
        );
        assert!(args(&["serve"]).unwrap_err().contains("usage: gridlet"));
        assert!(args(&["check-config", "--bogus"]).is_err());
        assert!(args(&["check-config", "--module", "x"]).is_err());
    }

    #[test]
    fn rust_log_sets_levels_by_target_and_falls_back_to_info() {
        use tracing::Level;
        let on = |var: Option<&str>, target: &str, level: Level| {
            log_filter(var).would_enable(target, &level)
        };
        assert!(on(None, "gridlet::broker", Level::INFO));
        assert!(!on(None, "gridlet::broker", Level::DEBUG));
        assert!(on(Some("debug"), "sled::tree", Level::DEBUG));
        assert!(on(
            Some("warn,gridlet=debug"),
            "gridlet::store",
            Level::DEBUG
        ));
        assert!(!on(Some("warn,gridlet=debug"), "sled::tree", Level::INFO));
        assert!(on(Some("warn,gridlet=debug"), "sled::tree", Level::WARN));
        // Unset, empty or not understood (EnvFilter's span directives): `info`.
        for var in ["", "  ", "[request{topic=t}]=debug", "gridlet=loud"] {
            assert!(on(Some(var), "gridlet", Level::INFO), "{var:?}");
            assert!(!on(Some(var), "gridlet", Level::DEBUG), "{var:?}");
        }
    }

    #[test]
    fn check_config_masks_secrets_and_marks_what_is_set() {
        let vars = vec![
            (
                "inbound__clientAuth__sasKeys__key1".to_string(),
                "topsecret".to_string(),
            ),
            (
                "broker:defaultMaxDeliveryAttempts".to_string(),
                "5".to_string(),
            ),
        ];
        let (out, code) = check_config(vars);
        assert_eq!(code, 0);
        assert!(!out.contains("topsecret"), "{out}");
        assert!(
            out.contains("* inbound__clientAuth__sasKeys__key1 = ***"),
            "{out}"
        );
        assert!(
            out.contains("* broker__defaultMaxDeliveryAttempts = 5"),
            "{out}"
        );
        let (out, code) = check_config(vec![(
            "inbound__serverAuth__tlsPolicy".to_string(),
            "sometimes".to_string(),
        )]);
        assert_eq!(code, 2);
        assert!(out.contains("inbound__serverAuth__tlsPolicy"), "{out}");
    }

    /// Issue 39: a misspelled setting is not valid; the key and the closest one are named,
    /// also beside an invalid value.
    #[test]
    fn check_config_refuses_misspelled_settings_naming_the_closest_key() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (out, code) = check_config(v(&[("inbound__serverAuth__tlsPolicies", "enabled")]));
        assert_eq!(code, 2, "{out}");
        assert!(!out.contains("is valid"), "{out}");
        assert!(
            out.contains(
                "unknown setting inbound__serverAuth__tlsPolicies (did you mean inbound__serverAuth__tlsPolicy?)"
            ),
            "{out}"
        );
        let (out, code) = check_config(v(&[
            ("broker:defaultMaxDeliveryAtempts", "3"),
            ("inbound__serverAuth__tlsPolicy", "sometimes"),
            ("PATH", "/bin"),
        ]));
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("strict, enabled, disabled"), "{out}");
        assert!(
            out.contains("did you mean broker__defaultMaxDeliveryAttempts?"),
            "{out}"
        );
        assert!(!out.contains("PATH"), "{out}");
    }
}
