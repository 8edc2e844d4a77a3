//! Prometheus text exposition (format 0.0.4): the one writer every `/metrics`-style page in loadlink
//! goes through, and the one strict parser that tests and the live bench read them back with.
//!
//! Why our own and not `prometheus-client`: every loadlink metric is a reading taken at scrape time
//! from state that already exists (atomics in `SinkStats`, the router's `LoadBook`, a snapshot),
//! not a value a registry owns. A registry would mean mirroring that state into a second set of
//! counters. The writer below is the part of such a crate that we need, with the format's rules
//! made structural:
//!
//! * **One group per metric.** Samples are written through a [`FamilyWriter`], which borrows the
//!   [`Exposition`] mutably and writes `# HELP` / `# TYPE` once when it is opened. Two families
//!   cannot interleave, because only one can be open at a time.
//! * **Typed label sets.** Labels are a [`LabelSet`]: a struct (or a fixed array of pairs) whose
//!   label names are `&'static str`; values are escaped here, once.
//! * **Numbers formatted once**: integers as integers, `NaN`, `+Inf`, `-Inf` as the format spells
//!   them.
//!
//! [`parse`] enforces the same rules on any text, so a test that parses a page proves it is
//! well-formed, not just that a prefix matched.

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

    fn parse(s: &str) -> Option<Self> {
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

// ---------------------------------------------------------------------------------------------
// The strict parser.

/// One parsed sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The full sample name (for a histogram, with its `_bucket`/`_sum`/`_count` suffix).
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One parsed family, with its samples in page order.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub ty: MetricType,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

/// A parsed page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub families: Vec<Family>,
}

impl Scrape {
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Every sample named exactly `name`, across families.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.families
            .iter()
            .flat_map(|f| &f.samples)
            .filter(move |s| s.name == name)
    }

    /// The value of the one sample named `name` whose labels include every pair in `labels`.
    /// `None` when there is no such sample or more than one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut hits = self
            .samples(name)
            .filter(|s| labels.iter().all(|(k, v)| s.label(k) == Some(*v)));
        let first = hits.next()?;
        hits.next().is_none().then_some(first.value)
    }
}

/// Why a page is not well-formed, with its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics text line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

fn valid_name(s: &str, colon: bool) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if s.starts_with(['i', 'I', 'n', 'N']) => None,
        _ => s.parse().ok(),
    }
}

/// The family a sample name belongs to, given the family currently open.
fn belongs(sample: &str, fam: &Family) -> bool {
    match sample.strip_prefix(fam.name.as_str()) {
        Some("") => fam.ty != MetricType::Histogram,
        Some("_bucket" | "_sum" | "_count") => fam.ty == MetricType::Histogram,
        _ => false,
    }
}

type Labels = Vec<(String, String)>;

/// `{a="x",b="y"}` → pairs, and the rest of the line after the closing brace.
fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let name = rest[..eq].trim();
        if !valid_name(name, false) {
            return Err(format!("invalid label name {name:?}"));
        }
        if labels.iter().any(|(k, _)| k == name) {
            return Err(format!("label {name:?} repeated"));
        }
        rest = rest[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name:?}: value must be a quoted string"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {name:?}: unterminated value")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    _ => return Err(format!("label {name:?}: bad escape")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((name.to_string(), value));
        rest = rest[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Parses a text-format page, rejecting what the format forbids: a sample before its family's
/// `# TYPE`, a family declared twice or resumed after another began, a repeated series, malformed
/// names, labels or values, and histograms without `+Inf` or with decreasing buckets.
pub fn parse(text: &str) -> Result<Scrape, ParseError> {
    let mut scrape = Scrape::default();
    let mut pending_help: Option<(String, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let err = |message: String| ParseError {
            line: i + 1,
            message,
        };
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut parts = comment.trim_start().splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(ty)) => {
                    let ty = MetricType::parse(ty.trim())
                        .ok_or_else(|| err(format!("unknown type {ty:?} for {name}")))?;
                    if !valid_name(name, true) {
                        return Err(err(format!("invalid metric name {name:?}")));
                    }
                    if scrape.family(name).is_some() {
                        return Err(err(format!("second # TYPE for {name}")));
                    }
                    let help = match pending_help.take() {
                        Some((n, h)) if n == name => Some(h),
                        Some((n, _)) => {
                            return Err(err(format!("# HELP for {n} not followed by its # TYPE")));
                        }
                        None => None,
                    };
                    scrape.families.push(Family {
                        name: name.to_string(),
                        ty,
                        help,
                        samples: Vec::new(),
                    });
                }
                (Some("HELP"), Some(name), help) => {
                    if pending_help.is_some() || scrape.family(name).is_some() {
                        return Err(err(format!("# HELP for {name} out of place")));
                    }
                    pending_help = Some((name.to_string(), help.unwrap_or("").to_string()));
                }
                _ => {} // a plain comment
            }
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if !valid_name(name, true) {
            return Err(err(format!("invalid metric name {name:?}")));
        }
        let (labels, rest) = match line[name_end..].trim_start().strip_prefix('{') {
            Some(r) => parse_labels(r).map_err(err)?,
            None => (Vec::new(), &line[name_end..]),
        };
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .and_then(parse_value)
            .ok_or_else(|| err(format!("{name}: missing or malformed value")))?;
        if let Some(ts) = fields.next()
            && ts.parse::<i64>().is_err()
        {
            return Err(err(format!("{name}: malformed timestamp {ts:?}")));
        }
        if fields.next().is_some() {
            return Err(err(format!("{name}: trailing text after the value")));
        }
        let Some(fam) = scrape.families.last_mut().filter(|f| belongs(name, f)) else {
            return Err(err(
                match scrape.families.iter().find(|f| belongs(name, f)) {
                    Some(f) => format!("sample {name} after family {} was closed", f.name),
                    None => format!("sample {name} has no # TYPE before it"),
                },
            ));
        };
        let mut key = labels.clone();
        key.sort();
        if fam.samples.iter().any(|s| {
            let mut k = s.labels.clone();
            k.sort();
            s.name == name && k == key
        }) {
            return Err(err(format!("series {name}{labels:?} repeated")));
        }
        fam.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    if let Some((n, _)) = pending_help {
        return Err(ParseError {
            line: text.lines().count(),
            message: format!("# HELP for {n} without # TYPE"),
        });
    }
    for f in scrape
        .families
        .iter()
        .filter(|f| f.ty == MetricType::Histogram)
    {
        check_histogram(f).map_err(|message| ParseError { line: 0, message })?;
    }
    Ok(scrape)
}

fn check_histogram(f: &Family) -> Result<(), String> {
    let bucket = format!("{}_bucket", f.name);
    let count = format!("{}_count", f.name);
    let series_key = |s: &Sample| {
        let mut l: Vec<_> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        l.sort();
        l
    };
    for c in f.samples.iter().filter(|s| s.name == count) {
        let key = series_key(c);
        let mut last = f64::NEG_INFINITY;
        let mut prev_n = 0.0;
        let mut inf = None;
        for b in f
            .samples
            .iter()
            .filter(|s| s.name == bucket && series_key(s) == key)
        {
            let le = b
                .label("le")
                .and_then(parse_value)
                .ok_or_else(|| format!("{bucket}: missing or bad le"))?;
            if le <= last || b.value < prev_n {
                return Err(format!("{bucket}: buckets out of order or decreasing"));
            }
            (last, prev_n) = (le, b.value);
            if le == f64::INFINITY {
                inf = Some(b.value);
            }
        }
        if inf != Some(c.value) {
            return Err(format!(
                "{}: +Inf bucket missing or not equal to _count",
                f.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Worker<'a> {
        url: &'a str,
        rank: u32,
    }
    impl LabelSet for Worker<'_> {
        fn write_labels(&self, w: &mut LabelWriter<'_>) {
            w.label("worker", self.url);
            w.label("rank", self.rank);
        }
    }

    fn page() -> String {
        let mut e = Exposition::new();
        e.single("a_total", MetricType::Counter, "Things", 3u64);
        e.family("b", MetricType::Gauge, "Per worker")
            .sample(
                &Worker {
                    url: "http://x\"y",
                    rank: 0,
                },
                1.5,
            )
            .sample(
                &Worker {
                    url: "http://z\\",
                    rank: 1,
                },
                f64::NAN,
            );
        e.family("lat_seconds", MetricType::Histogram, "Latency")
            .histogram(&[("route", "/v1")], [(0.1, 2), (1.0, 5)], 7, 2.25);
        e.finish()
    }

    #[test]
    fn written_page_parses_back_with_values_and_escapes() {
        let text = page();
        let s = parse(&text).unwrap();
        assert_eq!(s.families.len(), 3);
        assert_eq!(s.value("a_total", &[]), Some(3.0));
        assert_eq!(s.value("b", &[("worker", "http://x\"y")]), Some(1.5));
        assert!(s.value("b", &[("rank", "1")]).unwrap().is_nan());
        assert_eq!(s.value("lat_seconds_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(s.value("lat_seconds_count", &[("route", "/v1")]), Some(7.0));
        assert_eq!(s.family("b").unwrap().help.as_deref(), Some("Per worker"));
        assert!(text.contains("b{worker=\"http://z\\\\\",rank=\"1\"} NaN"));
    }

    #[test]
    fn parser_rejects_what_the_format_forbids() {
        let bad = [
            ("x 1\n", "no # TYPE"),
            ("# TYPE x gauge\n# TYPE y gauge\ny 1\nx 2\n", "closed"),
            ("# TYPE x gauge\nx 1\n# TYPE x gauge\n", "second # TYPE"),
            ("# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n", "repeated"),
            ("# TYPE x gauge\nx{a=1} 1\n", "quoted"),
            ("# TYPE x gauge\nx one\n", "malformed value"),
            ("# TYPE x wibble\n", "unknown type"),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_count 2\n",
                "+Inf",
            ),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",
                "decreasing",
            ),
            ("# HELP x a\n# TYPE y gauge\n", "not followed"),
        ];
        for (text, want) in bad {
            let e = parse(text).expect_err(text);
            assert!(e.message.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn numbers_are_spelled_as_the_format_wants() {
        let spelled: Vec<String> = [
            Number::from(7u64),
            Number::from(-1i64),
            Number::from(0.25),
            Number::from(f64::INFINITY),
            Number::from(f64::NEG_INFINITY),
            Number::from(true),
        ]
        .iter()
        .map(|n| n.to_string())
        .collect();
        assert_eq!(spelled, ["7", "-1", "0.25", "+Inf", "-Inf", "1"]);
    }
}
