//! The same series as `/metrics`, pushed over OTLP/gRPC to an OpenTelemetry collector
//! (`--otlp-endpoint`): the exposition an [`Exporter`] renders for Prometheus is read back
//! family by family and sent as OTLP metrics, so the two can never say different things.
//! Counters become cumulative monotonic sums (named without Prometheus's `_total`, as
//! OpenTelemetry names them; its Prometheus exporter adds it back), gauges gauges,
//! histograms explicit-bucket histograms; `_seconds` and `_bytes` give the units `s` and
//! `By`.

use std::{collections::BTreeMap, time::Duration};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        metrics_service_client::MetricsServiceClient, ExportMetricsServiceRequest,
    },
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
        Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Caller, Exporter};

/// Where and how often to push, and who the pusher is.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpOptions {
    /// The collector's OTLP/gRPC endpoint (`http://host:4317`).
    pub endpoint: String,
    /// How often to push.
    pub interval: Duration,
    /// Resource attributes (`service.name`, `host.name` and `OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Vec<(String, String)>,
    /// The variables naming the PEM files of an `https://` endpoint: the CA that signed the
    /// collector's certificate, and a client certificate and key (for collectors that ask
    /// for one); each the `_METRICS_` variable if set, else the general one.
    pub tls_vars: [Option<String>; 3],
}

impl OtlpOptions {
    /// The options `--otlp-endpoint` and `--otlp-interval` give, completed from the
    /// standard `OTEL_*` variables in `env` (flags first); None when no endpoint is named
    /// anywhere.
    pub fn from_flags_and_env(
        endpoint: Option<String>,
        interval: Option<Duration>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Option<OtlpOptions> {
        let endpoint = endpoint
            .or_else(|| env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))?;
        let interval = interval
            .or_else(|| {
                env("OTEL_METRIC_EXPORT_INTERVAL")?
                    .parse::<u64>()
                    .ok()
                    .map(Duration::from_millis)
            })
            .unwrap_or(Duration::from_mins(1));
        let mut resource = vec![(
            "service.name".to_string(),
            env("OTEL_SERVICE_NAME").unwrap_or_else(|| "commtap".into()),
        )];
        resource.push(("service.version".into(), env!("CARGO_PKG_VERSION").into()));
        resource.push(("host.name".into(), crate::discover::this_host()));
        // `key=value,key=value`, values percent-encoded per the specification.
        for pair in env("OTEL_RESOURCE_ATTRIBUTES")
            .unwrap_or_default()
            .split(',')
            .filter(|p| !p.trim().is_empty())
        {
            if let Some((k, v)) = pair.split_once('=') {
                let (k, v) = (k.trim().to_string(), percent_decoded(v.trim()));
                resource.retain(|(have, _)| *have != k);
                resource.push((k, v));
            }
        }
        let var = |name: &str| {
            let specific = format!("OTEL_EXPORTER_OTLP_METRICS_{name}");
            let general = format!("OTEL_EXPORTER_OTLP_{name}");
            env(&specific)
                .map(|_| specific)
                .or(env(&general).map(|_| general))
        };
        Some(OtlpOptions {
            endpoint,
            interval: interval.max(Duration::from_millis(100)),
            resource,
            tls_vars: [
                var("CERTIFICATE"),
                var("CLIENT_CERTIFICATE"),
                var("CLIENT_KEY"),
            ],
        })
    }
}

/// `%XX` sequences decoded (others kept as they are).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |at: usize| {
            b.get(at)
                .and_then(|c| (*c as char).to_digit(16))
                .map(|d| d as u8)
        };
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push(h * 16 + l);
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Label names and values, in order.
type Labels = Vec<(String, String)>;

/// One sample: its name (a histogram's `_bucket`, `_sum`, `_count`), labels and value.
type Sample = (String, Labels, f64);

/// One metric family of a Prometheus text exposition.
#[derive(Debug, Default, PartialEq)]
struct Family {
    name: String,
    kind: String,
    help: String,
    /// Its samples, in order.
    samples: Vec<Sample>,
}

/// The families of `text` (the format commtap writes: `# HELP`, `# TYPE`, then samples).
fn families(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push(Family {
                name: name.to_string(),
                help: help.to_string(),
                ..Family::default()
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            match out.last_mut() {
                Some(f) if f.name == name => f.kind = kind.to_string(),
                _ => out.push(Family {
                    name: name.to_string(),
                    kind: kind.to_string(),
                    ..Family::default()
                }),
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            if let (Some(f), Some(sample)) = (out.last_mut(), sample(line)) {
                f.samples.push(sample);
            }
        }
    }
    out
}

/// `name{a="x",b="y"} value` (label values escaped as the text format escapes them).
fn sample(line: &str) -> Option<Sample> {
    let Some(at) = line.find('{') else {
        let (name, value) = line.split_once(' ')?;
        return Some((name.to_string(), Vec::new(), parse_value(value.trim())?));
    };
    let (name, rest) = (&line[..at], &line[at + 1..]);
    let mut labels = Vec::new();
    let mut chars = rest.char_indices().peekable();
    loop {
        let (start, c) = chars.next()?;
        if c == '}' {
            let value = rest[start + 1..].trim();
            return Some((name.to_string(), labels, parse_value(value)?));
        }
        if c == ',' {
            continue;
        }
        let eq = rest[start..].find("=\"")? + start;
        let key = rest[start..eq].to_string();
        while chars.peek().is_some_and(|(at, _)| *at <= eq + 1) {
            chars.next();
        }
        let mut value = String::new();
        loop {
            match chars.next()?.1 {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.push((key, value));
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

fn key_value(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_string())),
        }),
        ..KeyValue::default()
    }
}

fn attributes(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| key_value(k, v)).collect()
}

/// The metric a family becomes (None for a family with no samples).
fn metric(f: &Family, start_ns: u64, now_ns: u64) -> Option<Metric> {
    if f.samples.is_empty() {
        return None;
    }
    let number = |labels: &[(String, String)], v: f64| NumberDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: start_ns,
        time_unix_nano: now_ns,
        value: Some(if v.fract() == 0.0 && v.abs() < 9.0e15 {
            number_data_point::Value::AsInt(v as i64)
        } else {
            number_data_point::Value::AsDouble(v)
        }),
        ..NumberDataPoint::default()
    };
    let (name, data) = match f.kind.as_str() {
        "counter" => (
            f.name.strip_suffix("_total").unwrap_or(&f.name),
            metric::Data::Sum(Sum {
                data_points: f.samples.iter().map(|(_, l, v)| number(l, *v)).collect(),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            }),
        ),
        "histogram" => (
            f.name.as_str(),
            metric::Data::Histogram(Histogram {
                data_points: histogram_points(f, start_ns, now_ns),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            }),
        ),
        _ => (
            f.name.as_str(),
            metric::Data::Gauge(Gauge {
                data_points: f.samples.iter().map(|(_, l, v)| number(l, *v)).collect(),
            }),
        ),
    };
    let unit = if name.ends_with("_seconds") {
        "s"
    } else if name.ends_with("_bytes") {
        "By"
    } else {
        ""
    };
    Some(Metric {
        name: name.to_string(),
        description: f.help.clone(),
        unit: unit.to_string(),
        data: Some(data),
        ..Metric::default()
    })
}

/// A histogram family's points: its `_bucket` samples (cumulative, by `le`) per label set,
/// with that set's `_sum` and `_count`.
fn histogram_points(f: &Family, start_ns: u64, now_ns: u64) -> Vec<HistogramDataPoint> {
    #[derive(Default)]
    struct Point {
        bounds: Vec<(f64, f64)>,
        sum: f64,
        count: f64,
    }
    let mut points: BTreeMap<Labels, Point> = BTreeMap::new();
    for (name, labels, v) in &f.samples {
        let (le, rest): (Vec<_>, Vec<_>) = labels.iter().cloned().partition(|(k, _)| k == "le");
        let p = points.entry(rest).or_default();
        match name.strip_prefix(f.name.as_str()) {
            Some("_bucket") => {
                if let Some(le) = le.first().and_then(|(_, le)| parse_value(le)) {
                    p.bounds.push((le, *v));
                }
            }
            Some("_sum") => p.sum = *v,
            Some("_count") => p.count = *v,
            _ => {}
        }
    }
    points
        .into_iter()
        .map(|(labels, mut p)| {
            p.bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut counts = Vec::with_capacity(p.bounds.len() + 1);
            let mut below = 0.0;
            let mut bounds = Vec::new();
            for (le, cumulative) in &p.bounds {
                counts.push((cumulative - below).max(0.0) as u64);
                below = *cumulative;
                if le.is_finite() {
                    bounds.push(*le);
                }
            }
            // OTLP's last bucket is the one above every bound (Prometheus's +Inf).
            if p.bounds.last().is_none_or(|(le, _)| le.is_finite()) {
                counts.push((p.count - below).max(0.0) as u64);
            }
            HistogramDataPoint {
                attributes: attributes(&labels),
                start_time_unix_nano: start_ns,
                time_unix_nano: now_ns,
                count: p.count as u64,
                sum: Some(p.sum),
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..HistogramDataPoint::default()
            }
        })
        .collect()
}

/// The request that carries `exposition`.
fn request(
    exposition: &str,
    opts: &OtlpOptions,
    start_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    let metrics = families(exposition)
        .iter()
        .filter_map(|f| metric(f, start_ns, now_ns))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: opts.resource.iter().map(|(k, v)| key_value(k, v)).collect(),
                ..Resource::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "commtap".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                metrics,
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    }
}

/// The collector's endpoint; an `https://` one verified against the CA the standard
/// variables name, with the client certificate they name, if any.
fn endpoint(opts: &OtlpOptions) -> anyhow::Result<tonic::transport::Endpoint> {
    use anyhow::Context as _;
    if !opts.endpoint.starts_with("https://") {
        return Ok(tonic::transport::Endpoint::from_shared(
            opts.endpoint.clone(),
        )?);
    }
    let pem = |i: usize, what: &str| match &opts.tls_vars[i] {
        Some(var) => crate::api::transport::pem_from_env(var, what),
        None => Ok(None),
    };
    let ca = pem(0, "CA bundle")?.context(
        "give the CA that signed the collector's certificate with OTEL_EXPORTER_OTLP_CERTIFICATE",
    )?;
    let identity = pem(1, "client certificate")?.zip(pem(2, "client key")?);
    crate::api::transport::tls_endpoint(&opts.endpoint, ca, identity)
}

/// Pushes what `state` shows every caller, every `opts.interval`, until `shutdown` (and
/// once more then); a collector that is down is retried at the next push, said once.
pub async fn push<E: Exporter>(
    state: std::sync::Arc<E>,
    opts: OtlpOptions,
    shutdown: CancellationToken,
) {
    let start_ns = crate::clock::unix_now_ns();
    let channel = match endpoint(&opts) {
        Ok(e) => e.connect_timeout(Duration::from_secs(5)).connect_lazy(),
        Err(e) => {
            warn!("OTLP export to {}: {e:#}", opts.endpoint);
            return;
        }
    };
    let mut client = MetricsServiceClient::new(channel);
    info!(
        "pushing metrics over OTLP to {} every {:?}",
        opts.endpoint, opts.interval
    );
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        let last = tokio::select! {
            () = shutdown.cancelled() => true,
            _ = tick.tick() => false,
        };
        let text = super::everything(state.as_ref(), Caller::Any).await;
        let req = request(&text, &opts, start_ns, crate::clock::unix_now_ns());
        let export = tokio::time::timeout(
            opts.interval.max(Duration::from_secs(5)),
            client.export(req),
        );
        match export.await {
            Ok(Ok(_)) => {
                if std::mem::take(&mut failing) {
                    info!("OTLP export to {} works again", opts.endpoint);
                }
                debug!("OTLP export done");
            }
            Ok(Err(e)) if !failing => {
                failing = true;
                warn!("OTLP export to {}: {}", opts.endpoint, e.message());
            }
            Err(_) if !failing => {
                failing = true;
                warn!("OTLP export to {}: timed out", opts.endpoint);
            }
            _ => {}
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP commtap_mpi_calls_total MPI calls.\n\
        # TYPE commtap_mpi_calls_total counter\n\
        commtap_mpi_calls_total{job_id=\"j \\\"1\\\"\",rank=\"0\",routine=\"MPI_Send\"} 12\n\
        # HELP commtap_mpi_seconds_total Time.\n\
        # TYPE commtap_mpi_seconds_total counter\n\
        commtap_mpi_seconds_total{job_id=\"j\",rank=\"0\",routine=\"MPI_Send\"} 0.5\n\
        # HELP commtap_up Up.\n\
        # TYPE commtap_up gauge\n\
        commtap_up 1\n\
        # HELP commtap_d_seconds Durations.\n\
        # TYPE commtap_d_seconds histogram\n\
        commtap_d_seconds_bucket{rank=\"0\",le=\"0.001\"} 2\n\
        commtap_d_seconds_bucket{rank=\"0\",le=\"0.01\"} 5\n\
        commtap_d_seconds_bucket{rank=\"0\",le=\"+Inf\"} 6\n\
        commtap_d_seconds_sum{rank=\"0\"} 0.25\n\
        commtap_d_seconds_count{rank=\"0\"} 6\n";

    fn opts() -> OtlpOptions {
        OtlpOptions {
            endpoint: "http://127.0.0.1:4317".into(),
            interval: Duration::from_secs(1),
            resource: vec![("service.name".into(), "commtap".into())],
            tls_vars: [None, None, None],
        }
    }

    #[test]
    fn every_family_becomes_its_otlp_kind_with_the_same_values() {
        let req = request(TEXT, &opts(), 1, 2);
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "commtap_mpi_calls",
                "commtap_mpi_seconds",
                "commtap_up",
                "commtap_d_seconds"
            ]
        );
        let Some(metric::Data::Sum(calls)) = &metrics[0].data else {
            panic!("a counter is a sum: {:?}", metrics[0]);
        };
        assert!(calls.is_monotonic);
        let p = &calls.data_points[0];
        assert_eq!(p.value, Some(number_data_point::Value::AsInt(12)));
        let labels: Vec<(&str, String)> = p
            .attributes
            .iter()
            .map(|kv| {
                let Some(any_value::Value::StringValue(v)) =
                    kv.value.as_ref().and_then(|v| v.value.clone())
                else {
                    panic!("a string")
                };
                (kv.key.as_str(), v)
            })
            .collect();
        assert_eq!(
            labels,
            [
                ("job_id", "j \"1\"".to_string()),
                ("rank", "0".into()),
                ("routine", "MPI_Send".into())
            ]
        );
        assert_eq!(metrics[1].unit, "s");
        let Some(metric::Data::Sum(secs)) = &metrics[1].data else {
            panic!("a sum");
        };
        assert_eq!(
            secs.data_points[0].value,
            Some(number_data_point::Value::AsDouble(0.5))
        );
        assert!(matches!(metrics[2].data, Some(metric::Data::Gauge(_))));
        let Some(metric::Data::Histogram(h)) = &metrics[3].data else {
            panic!("a histogram");
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, [0.001, 0.01]);
        assert_eq!(p.bucket_counts, [2, 3, 1]);
        assert_eq!((p.count, p.sum), (6, Some(0.25)));
    }

    #[test]
    fn the_standard_variables_fill_in_what_no_flag_says() {
        let env = |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4317".to_string()),
            "OTEL_METRIC_EXPORT_INTERVAL" => Some("2500".to_string()),
            "OTEL_SERVICE_NAME" => Some("hpc".to_string()),
            "OTEL_RESOURCE_ATTRIBUTES" => Some("cluster=a%2Cb, service.name=x".to_string()),
            "OTEL_EXPORTER_OTLP_CERTIFICATE" | "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY" => {
                Some("/some.pem".to_string())
            }
            _ => None,
        };
        let o = OtlpOptions::from_flags_and_env(None, None, env).expect("an endpoint");
        assert_eq!(o.endpoint, "http://collector:4317");
        assert_eq!(o.interval, Duration::from_millis(2500));
        let attr = |k: &str| {
            o.resource
                .iter()
                .find(|(have, _)| have == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(attr("cluster"), Some("a,b"));
        assert_eq!(attr("service.name"), Some("x"));
        assert_eq!(
            o.tls_vars,
            [
                Some("OTEL_EXPORTER_OTLP_CERTIFICATE".to_string()),
                None,
                Some("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY".to_string())
            ]
        );
        let o = OtlpOptions::from_flags_and_env(
            Some("http://flag:4317".into()),
            Some(Duration::from_secs(3)),
            env,
        )
        .expect("an endpoint");
        assert_eq!(
            (o.endpoint.as_str(), o.interval),
            ("http://flag:4317", Duration::from_secs(3))
        );
        assert_eq!(OtlpOptions::from_flags_and_env(None, None, |_| None), None);
    }
}
