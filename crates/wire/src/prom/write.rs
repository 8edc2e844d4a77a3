//! The writer: families opened one at a time, labels typed and escaped, numbers spelled once.

use std::borrow::Cow;
use std::fmt::{self, Display, Write};

/// A metric family's type, as written on its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Untyped,
}

impl MetricType {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Untyped => "untyped",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "untyped" => MetricType::Untyped,
            _ => return None,
        })
    }
}

/// Writes one label pair; handed to [`LabelSet::write_labels`].
pub struct LabelWriter<'a> {
    out: &'a mut String,
    count: usize,
}

impl LabelWriter<'_> {
    /// Adds `name="value"`, escaping the value.
    pub fn label(&mut self, name: &'static str, value: impl Display) {
        self.out.push(if self.count == 0 { '{' } else { ',' });
        self.count += 1;
        self.out.push_str(name);
        self.out.push_str("=\"");
        let start = self.out.len();
        let _ = write!(self.out, "{value}");
        if self.out[start..].contains(['\\', '"', '\n']) {
            let raw = self.out.split_off(start);
            for c in raw.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
        }
        self.out.push('"');
    }
}

/// A set of labels with fixed names. Implement it on a small struct per metric family.
pub trait LabelSet {
    fn write_labels(&self, w: &mut LabelWriter<'_>);
}

/// No labels.
impl LabelSet for () {
    fn write_labels(&self, _: &mut LabelWriter<'_>) {}
}

/// A fixed list of `(name, value)` pairs.
impl<V: Display, const N: usize> LabelSet for [(&'static str, V); N] {
    fn write_labels(&self, w: &mut LabelWriter<'_>) {
        for (k, v) in self {
            w.label(k, v);
        }
    }
}

/// Two label sets written one after the other (a family's own labels plus, say, `le`).
impl<A: LabelSet, B: LabelSet> LabelSet for (&A, &B) {
    fn write_labels(&self, w: &mut LabelWriter<'_>) {
        self.0.write_labels(w);
        self.1.write_labels(w);
    }
}

/// A sample value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i128),
    Float(f64),
}

impl Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) if x.is_nan() => f.write_str("NaN"),
            Number::Float(x) if x == f64::INFINITY => f.write_str("+Inf"),
            Number::Float(x) if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            Number::Float(x) => write!(f, "{x}"),
        }
    }
}

macro_rules! int_number {
    ($($t:ty),*) => {$(
        impl From<$t> for Number {
            fn from(v: $t) -> Self {
                Number::Int(v as i128)
            }
        }
    )*};
}
int_number!(u8, u16, u32, u64, usize, i32, i64);

impl From<f64> for Number {
    fn from(v: f64) -> Self {
        Number::Float(v)
    }
}

impl From<bool> for Number {
    fn from(v: bool) -> Self {
        Number::Int(i128::from(v))
    }
}

/// A whole exposition page being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    families: Vec<Cow<'static, str>>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens family `name`: writes its `# HELP` and `# TYPE` lines. Its samples follow through the
    /// returned writer. Opening a name twice is a bug in the caller (checked in debug builds).
    pub fn family(
        &mut self,
        name: impl Into<Cow<'static, str>>,
        ty: MetricType,
        help: &str,
    ) -> FamilyWriter<'_> {
        let name = name.into();
        debug_assert!(
            !self.families.contains(&name),
            "metric family {name} opened twice"
        );
        self.families.push(name.clone());
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            help.replace('\\', "\\\\").replace('\n', "\\n"),
            ty.as_str()
        );
        FamilyWriter {
            out: &mut self.out,
            name,
        }
    }

    /// Shorthand: a family with one unlabelled sample.
    pub fn single(&mut self, name: &'static str, ty: MetricType, help: &str, v: impl Into<Number>) {
        self.family(name, ty, help).sample(&(), v);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// The samples of one open family.
pub struct FamilyWriter<'a> {
    out: &'a mut String,
    name: Cow<'static, str>,
}

impl FamilyWriter<'_> {
    /// One sample of the family itself.
    pub fn sample(&mut self, labels: &dyn LabelSet, v: impl Into<Number>) -> &mut Self {
        self.line("", labels, v.into());
        self
    }

    /// A histogram's series for one label set: cumulative `buckets` as `(upper bound, count)` in
    /// increasing order, then `+Inf` (= `count`), `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        labels: &dyn LabelSet,
        buckets: impl IntoIterator<Item = (f64, u64)>,
        count: u64,
        sum: f64,
    ) -> &mut Self {
        for (le, n) in buckets {
            self.line(
                "_bucket",
                &(&Dyn(labels), &[("le", Number::Float(le))]),
                n.into(),
            );
        }
        self.line("_bucket", &(&Dyn(labels), &[("le", "+Inf")]), count.into());
        self.line("_sum", labels, sum.into());
        self.line("_count", labels, count.into());
        self
    }

    fn line(&mut self, suffix: &str, labels: &dyn LabelSet, v: Number) {
        self.out.push_str(&self.name);
        self.out.push_str(suffix);
        let mut w = LabelWriter {
            out: self.out,
            count: 0,
        };
        labels.write_labels(&mut w);
        if w.count > 0 {
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }
}

/// Adapts a `&dyn LabelSet` to the generic pair impl.
struct Dyn<'a>(&'a dyn LabelSet);

impl LabelSet for Dyn<'_> {
    fn write_labels(&self, w: &mut LabelWriter<'_>) {
        self.0.write_labels(w);
    }
}
