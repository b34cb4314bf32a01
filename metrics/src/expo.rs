//! Prometheus text exposition (format 0.0.4): metric families in the order first added, each
//! with its `# HELP` and `# TYPE` lines, label values escaped.
//!
//! The renderer writes what a snapshot holds, absolute values, so a process or connection
//! that is gone is gone from the next scrape (no recorder keeps stale series alive).

use std::collections::HashMap;
use std::fmt::Write as _;

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Samples `<name>_bucket{le}` and `<name>_count` ([`Exposition::add_part`]).
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

    /// Declares a family (its help and type) without samples yet; a family never given a
    /// sample is still listed, which tells a reader the metric exists.
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

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(128 * self.len() + 256 * self.families.len());
        for f in &self.families {
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

    #[test]
    fn renders_families_in_order_with_escapes() {
        let mut e = Exposition::new();
        e.add(
            "a_total",
            Kind::Counter,
            "A count.\nTwo lines \\ here",
            vec![("x", "q\"uo\\te\nnl".into())],
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
        assert_eq!(e.len(), 4);
        assert_eq!(
            e.render(),
            "# HELP a_total A count.\\nTwo lines \\\\ here\n# TYPE a_total counter\n\
             a_total{x=\"q\\\"uo\\\\te\\nnl\"} 7\na_total{x=\"2\"} 18446744073709551615\n\
             # HELP empty Never set.\n# TYPE empty gauge\n\
             # HELP b B.\n# TYPE b gauge\nb 0.5\nb{y=\"\"} NaN\n"
        );
    }

    #[test]
    fn histogram_parts() {
        let mut e = Exposition::new();
        let l = || vec![("c", "1".to_string())];
        let mut le = l();
        le.push(("le", "+Inf".into()));
        e.add_part("d_seconds", "_bucket", Kind::Histogram, "D.", le, 3u64);
        e.add_part("d_seconds", "_count", Kind::Histogram, "D.", l(), 3u64);
        assert_eq!(
            e.render(),
            "# HELP d_seconds D.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{c=\"1\",le=\"+Inf\"} 3\nd_seconds_count{c=\"1\"} 3\n"
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
