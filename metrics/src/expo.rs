//! Prometheus text exposition (format 0.0.4), rendered by `metrics-exporter-prometheus`
//! (through the `metrics` facade's `Recorder` trait): counters and gauges go into a recorder
//! made for one scrape and rendered by it, with its `# HELP` and `# TYPE` lines and label
//! escaping. Histograms come already bucketed from a policy's map, with no sum, which that
//! crate cannot carry (see [`Kind::Histogram`]); they are written here, after the others.
//!
//! The renderer writes what a snapshot holds, absolute values, so a process or connection
//! that is gone is gone from the next scrape (no recorder outlives the scrape, so none keeps
//! stale series alive). Families come in the crate's order (not the order they were added),
//! and a family without samples is not listed.

use std::collections::HashMap;
use std::fmt::Write as _;

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Samples `<name>_bucket{le}` and `<name>_count` ([`Exposition::add_part`]), written here:
    /// `metrics-exporter-prometheus` takes histograms only as observed values (its
    /// `record_many` records each of `count` observations one by one, so replaying a policy's
    /// bucket counts would cost every request ever counted at every scrape) and always writes a
    /// `_sum`, which the policy does not keep.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value: integers are written exactly, floats as Rust prints them (`NaN`, `+Inf`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    U(u64),
    F(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F(v)
    }
}

/// Labels of one sample: names are static identifiers, values any text.
pub type Labels = Vec<(&'static str, String)>;

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Suffix of the sample name (`_bucket`, `_count` of a histogram; empty otherwise),
    /// labels, value.
    samples: Vec<(&'static str, Labels, Value)>,
}

/// Families and their samples, rendered by [`Exposition::render`].
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<&'static str, usize>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Declares a family (its help and type) without samples yet (it is listed only once it
    /// has one).
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) {
        if !self.index.contains_key(name) {
            debug_assert!(valid_name(name), "{name}");
            self.index.insert(name, self.families.len());
            self.families.push(Family {
                name,
                help,
                kind,
                samples: vec![],
            });
        }
    }

    /// One sample of family `name` (declared on first use with `kind` and `help`).
    pub fn add(
        &mut self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        labels: Labels,
        value: impl Into<Value>,
    ) {
        self.add_part(name, "", kind, help, labels, value);
    }

    /// A sample `<name><suffix>` of family `name` (a histogram's `_bucket` and `_count`).
    pub fn add_part(
        &mut self,
        name: &'static str,
        suffix: &'static str,
        kind: Kind,
        help: &'static str,
        labels: Labels,
        value: impl Into<Value>,
    ) {
        self.family(name, kind, help);
        let i = self.index[name];
        self.families[i]
            .samples
            .push((suffix, labels, value.into()));
    }

    /// Samples so far (all families).
    pub fn len(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text exposition: counters and gauges through a fresh `PrometheusRecorder`, then
    /// the histograms.
    pub fn render(&self) -> String {
        use metrics::{Key, KeyName, Label, Metadata, Recorder, SharedString};
        const META: Metadata<'static> =
            Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        for f in &self.families {
            if f.samples.is_empty() || f.kind == Kind::Histogram {
                continue;
            }
            let (name, help) = (
                KeyName::from_const_str(f.name),
                SharedString::const_str(f.help),
            );
            match f.kind {
                Kind::Counter => recorder.describe_counter(name, None, help),
                _ => recorder.describe_gauge(name, None, help),
            }
            for (_, labels, v) in &f.samples {
                let labels: Vec<Label> = labels
                    .iter()
                    .map(|(k, v)| Label::new(*k, v.clone()))
                    .collect();
                let key = Key::from_parts(f.name, labels);
                match (f.kind, *v) {
                    (Kind::Counter, Value::U(u)) => {
                        recorder.register_counter(&key, &META).absolute(u)
                    }
                    (Kind::Counter, Value::F(x)) => {
                        recorder.register_counter(&key, &META).absolute(x as u64)
                    }
                    (_, Value::U(u)) => recorder.register_gauge(&key, &META).set(u as f64),
                    (_, Value::F(x)) => recorder.register_gauge(&key, &META).set(x),
                }
            }
        }
        let mut s = recorder.handle().render();
        for f in self.families.iter().filter(|f| f.kind == Kind::Histogram) {
            if f.samples.is_empty() {
                continue;
            }
            let _ = writeln!(s, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(s, "# TYPE {} {}", f.name, f.kind.name());
            for (suffix, labels, v) in &f.samples {
                s.push_str(f.name);
                s.push_str(suffix);
                if !labels.is_empty() {
                    s.push('{');
                    for (k, (n, val)) in labels.iter().enumerate() {
                        if k > 0 {
                            s.push(',');
                        }
                        s.push_str(n);
                        s.push_str("=\"");
                        escape_label(&mut s, val);
                        s.push('"');
                    }
                    s.push('}');
                }
                s.push(' ');
                write_value(&mut s, *v);
                s.push('\n');
            }
        }
        s
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn write_value(s: &mut String, v: Value) {
    let _ = match v {
        Value::U(u) => write!(s, "{u}"),
        Value::F(f) if f.is_nan() => write!(s, "NaN"),
        Value::F(f) if f == f64::INFINITY => write!(s, "+Inf"),
        Value::F(f) if f == f64::NEG_INFINITY => write!(s, "-Inf"),
        Value::F(f) => write!(s, "{f}"),
    };
}

/// Label values: backslash, double quote and line feed escaped.
fn escape_label(s: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
}

/// Help text: backslash and line feed escaped.
fn escape_help(h: &str) -> String {
    h.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `text` that are not blank, sorted (the crate's order is its own).
    fn sorted(text: &str) -> Vec<&str> {
        let mut l: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        l.sort_unstable();
        l
    }

    #[test]
    fn renders_families_with_help_type_and_escapes() {
        let mut e = Exposition::new();
        e.add(
            "a_total",
            Kind::Counter,
            "A count.\nTwo lines",
            vec![("x", "q\"uo\nnl".into())],
            7u64,
        );
        e.family("empty", Kind::Gauge, "Never set.");
        e.add("b", Kind::Gauge, "B.", vec![], 0.5);
        e.add(
            "a_total",
            Kind::Counter,
            "ignored",
            vec![("x", "2".into())],
            u64::MAX,
        );
        e.add("b", Kind::Gauge, "B.", vec![("y", "".into())], f64::NAN);
        e.add(
            "c",
            Kind::Gauge,
            "C.",
            vec![("z", "1".into())],
            (1u64 << 53) + 1,
        );
        assert_eq!(e.len(), 5);
        let text = e.render();
        assert_eq!(
            sorted(&text),
            [
                "# HELP a_total A count.\\nTwo lines",
                "# HELP b B.",
                "# HELP c C.",
                "# TYPE a_total counter",
                "# TYPE b gauge",
                "# TYPE c gauge",
                "a_total{x=\"2\"} 18446744073709551615",
                "a_total{x=\"q\\\"uo\\nnl\"} 7",
                "b 0.5",
                "b{y=\"\"} NaN",
                // Gauges are doubles: 2^53 + 1 is written as the double nearest it.
                "c{z=\"1\"} 9007199254740992",
            ],
            "{text}"
        );
        // Each family's HELP and TYPE come before its samples; a family without samples is
        // not listed.
        let at = |l: &str| text.find(l).unwrap();
        assert!(at("# TYPE a_total counter") < at("a_total{x=\"2\"}"));
        assert!(!text.contains("empty"), "{text}");
    }

    /// Backslashes in label values, as the crate escapes them: alone, or before a character
    /// that needs no escape, they are doubled (read back as written); two in a row, or one
    /// before a quote, are taken as an escape already made (read back as one backslash, or a
    /// quote alone). ncclbpf's label values (numbers, hex, host, map and hook names) hold none.
    #[test]
    fn backslashes_in_label_values() {
        let mut e = Exposition::new();
        for (i, v) in ["a\\b", "end\\", "two\\\\", "q\\\""].iter().enumerate() {
            e.add(
                "g",
                Kind::Gauge,
                "G.",
                vec![("i", i.to_string()), ("v", v.to_string())],
                1u64,
            );
        }
        let text = e.render();
        for l in [
            "g{i=\"0\",v=\"a\\\\b\"} 1",
            "g{i=\"1\",v=\"end\\\\\"} 1",
            "g{i=\"2\",v=\"two\\\\\"} 1",
            "g{i=\"3\",v=\"q\\\"\"} 1",
        ] {
            assert!(text.lines().any(|x| x == l), "{l}: {text}");
        }
    }

    #[test]
    fn histogram_parts() {
        let mut e = Exposition::new();
        let l = || vec![("c", "1".to_string())];
        let mut le = l();
        le.push(("le", "+Inf".into()));
        e.add_part("d_seconds", "_bucket", Kind::Histogram, "D.", le, 3u64);
        e.add_part("d_seconds", "_count", Kind::Histogram, "D.", l(), 3u64);
        e.add("z", Kind::Gauge, "Z.", vec![], 1u64);
        let text = e.render();
        assert!(
            text.ends_with(
                "# HELP d_seconds D.\n# TYPE d_seconds histogram\n\
                 d_seconds_bucket{c=\"1\",le=\"+Inf\"} 3\nd_seconds_count{c=\"1\"} 3\n"
            ),
            "{text}"
        );
        assert!(
            text.starts_with("# HELP z Z.\n# TYPE z gauge\nz 1\n"),
            "{text}"
        );
    }

    #[test]
    fn floats_and_names() {
        let mut s = String::new();
        for v in [1e21, 1.5e-9, f64::INFINITY, -0.0] {
            write_value(&mut s, Value::F(v));
            s.push(' ');
        }
        assert_eq!(s, "1000000000000000000000 0.0000000015 +Inf -0 ");
        assert!(valid_name("nccl_net_sent_bytes_total") && !valid_name("9x") && !valid_name("a-b"));
    }
}
