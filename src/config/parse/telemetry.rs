//! The `OTEL_*` variables (the OpenTelemetry SDK environment specification, the subset gridlet
//! implements) and `telemetry__*`.

use super::{ConfigError, Raw, K};
use crate::config::types::{Sampler, Telemetry};
use std::time::Duration;

/// `OTEL_*`, `telemetry__*`.
pub(in crate::config) fn telemetry(raw: &Raw) -> Result<Telemetry, ConfigError> {
    raw.choice(K::OTEL_EXPORTER_OTLP_PROTOCOL, &[("http/protobuf", ())])?;
    let traces_endpoint = signal_endpoint(raw, K::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "traces")?;
    let metrics_endpoint = signal_endpoint(raw, K::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "metrics")?;
    let headers = match raw.given(K::OTEL_EXPORTER_OTLP_HEADERS) {
        Some(h) => pairs(h).ok_or_else(|| {
            // The value is a secret: the error names the key and the form only.
            ConfigError {
                key: K::OTEL_EXPORTER_OTLP_HEADERS.name().to_string(),
                value: "***".to_string(),
                expected: "key=value pairs separated by commas".to_string(),
            }
        })?,
        None => Vec::new(),
    };
    let resource_attributes = match raw.given(K::OTEL_RESOURCE_ATTRIBUTES) {
        Some(r) => pairs(r).ok_or_else(|| {
            raw.err(
                K::OTEL_RESOURCE_ATTRIBUTES,
                "key=value pairs separated by commas",
            )
        })?,
        None => Vec::new(),
    };
    let kind = raw.choice(
        K::OTEL_TRACES_SAMPLER,
        &[
            ("always_on", (false, Some(1.0))),
            ("always_off", (false, Some(0.0))),
            ("traceidratio", (false, None)),
            ("parentbased_always_on", (true, Some(1.0))),
            ("parentbased_always_off", (true, Some(0.0))),
            ("parentbased_traceidratio", (true, None)),
        ],
    )?;
    let ratio = match kind.1 {
        Some(r) => r,
        None => raw
            .text(K::OTEL_TRACES_SAMPLER_ARG)
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| raw.err(K::OTEL_TRACES_SAMPLER_ARG, "a number from 0 to 1"))?,
    };
    Ok(Telemetry {
        traces_endpoint,
        metrics_endpoint,
        metrics_interval: Duration::from_millis(raw.int(
            K::OTEL_METRIC_EXPORT_INTERVAL,
            100,
            86_400_000,
        )?),
        headers,
        timeout: Duration::from_millis(raw.int(K::OTEL_EXPORTER_OTLP_TIMEOUT, 1, 600_000)?),
        service_name: raw
            .given(K::OTEL_SERVICE_NAME)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        resource_attributes,
        sampler: Sampler {
            parent_based: kind.0,
            ratio,
        },
        max_queue_size: raw.int(K::OTEL_BSP_MAX_QUEUE_SIZE, 1, 1_000_000)? as usize,
        max_export_batch_size: raw.int(K::OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 1, 100_000)? as usize,
        schedule_delay: Duration::from_millis(raw.int(K::OTEL_BSP_SCHEDULE_DELAY, 1, 3_600_000)?),
        event_ids_on_spans: raw.bool(K::telemetry__eventIdsOnSpans)?,
    })
}

/// A signal's URL: its own variable (used as is), else `<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/<signal>`.
fn signal_endpoint(raw: &Raw, own: K, signal: &str) -> Result<Option<String>, ConfigError> {
    Ok(match raw.given(own) {
        Some(url) if !url.is_empty() => Some(endpoint(raw, own, url)?),
        _ => match raw.given(K::OTEL_EXPORTER_OTLP_ENDPOINT) {
            Some(base) if !base.is_empty() => {
                let base = endpoint(raw, K::OTEL_EXPORTER_OTLP_ENDPOINT, base)?;
                Some(format!("{}/v1/{signal}", base.trim_end_matches('/')))
            }
            _ => None,
        },
    })
}

/// An `http://` or `https://` URL with a host.
fn endpoint(raw: &Raw, key: K, url: &str) -> Result<String, ConfigError> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(url.to_string())
        }
        _ => Err(raw.err(key, "an http:// or https:// URL")),
    }
}

/// `k=v,k2=v2` (the W3C Baggage-like form the OpenTelemetry variables use), values
/// percent-decoded. `None` for a member without `=` or with an empty key.
fn pairs(s: &str) -> Option<Vec<(String, String)>> {
    s.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| {
            let (k, v) = m.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            let v = percent_encoding::percent_decode_str(v.trim())
                .decode_utf8_lossy()
                .into_owned();
            Some((k.to_string(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, crate::config::ConfigError> {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn off_by_default_and_endpoints_as_the_sdk_reads_them() {
        let t = cfg(&[]).unwrap().telemetry;
        assert_eq!(t.traces_endpoint, None);
        assert!(t.sampler.parent_based && t.sampler.ratio == 1.0);
        let t = cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")])
            .unwrap()
            .telemetry;
        assert_eq!(
            t.traces_endpoint.as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            t.metrics_endpoint.as_deref(),
            Some("http://c:4318/v1/metrics")
        );
        let t = cfg(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://d/x"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%3Dcret, x=y"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=lab"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ])
        .unwrap()
        .telemetry;
        assert_eq!(t.traces_endpoint.as_deref(), Some("https://d/x"));
        assert_eq!(t.headers[0], ("api-key".into(), "s=cret".into()));
        assert!(
            !format!("{t:?}").contains("cret"),
            "header values never in Debug"
        );
        assert_eq!(
            t.resource_attributes,
            vec![("deployment.environment".into(), "lab".into())]
        );
        assert_eq!(t.sampler.ratio, 0.01);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ] {
            let e = cfg(&[(k, v)]).err().unwrap().to_string();
            assert!(e.contains(k), "{e}");
        }
        let e = cfg(&[("OTEL_EXPORTER_OTLP_HEADERS", "secretvalue")])
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains("secretvalue"), "{e}");
        let e = cfg(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ])
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("OTEL_TRACES_SAMPLER_ARG"), "{e}");
    }
}
