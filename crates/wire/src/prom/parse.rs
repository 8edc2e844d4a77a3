//! The strict parser: what the text format forbids is an error naming the line.
//!
//! Linear in the page (pages come from peers, and a scraped worker may send hundreds of thousands
//! of samples): families and series already seen are found through hash sets, histogram series
//! are grouped in one pass, and nothing is searched per line.

use super::MetricType;
use std::collections::{HashMap, HashSet};

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
            return match repeated_label(&labels) {
                Some(name) => Err(format!("label {name:?} repeated")),
                None => Ok((labels, r)),
            };
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let name = rest[..eq].trim();
        if !valid_name(name, false) {
            return Err(format!("invalid label name {name:?}"));
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

/// The first label name (in name order) that occurs twice; sorting keeps a line with thousands of
/// labels linear-logarithmic.
fn repeated_label(labels: &Labels) -> Option<&str> {
    if labels.len() < 2 {
        return None;
    }
    let mut names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Parses a text-format page, rejecting what the format forbids: a sample before its family's
/// `# TYPE`, a family declared twice or resumed after another began, a repeated series, malformed
/// names, labels or values, and histograms without `+Inf` or with decreasing buckets.
pub fn parse(text: &str) -> Result<Scrape, ParseError> {
    let mut p = PageParser::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let result = match line.strip_prefix('#') {
            _ if line.is_empty() => Ok(()),
            Some(comment) => p.comment(comment),
            None => p.sample(line),
        };
        result.map_err(|message| ParseError {
            line: i + 1,
            message,
        })?;
    }
    if let Some((n, _)) = p.pending_help {
        return Err(ParseError {
            line: text.lines().count(),
            message: format!("# HELP for {n} without # TYPE"),
        });
    }
    for f in p
        .scrape
        .families
        .iter()
        .filter(|f| f.ty == MetricType::Histogram)
    {
        check_histogram(f).map_err(|message| ParseError { line: 0, message })?;
    }
    Ok(p.scrape)
}

/// The page read so far, and a `# HELP` waiting for its `# TYPE`.
#[derive(Default)]
struct PageParser {
    scrape: Scrape,
    pending_help: Option<(String, String)>,
    /// Names of the families opened so far.
    families: HashSet<String>,
    /// Every series so far: sample name and sorted labels.
    series: HashSet<(String, Labels)>,
}

impl PageParser {
    /// A `# …` line: `TYPE` opens a family, `HELP` precedes one, anything else is a comment.
    fn comment(&mut self, comment: &str) -> Result<(), String> {
        let mut parts = comment.trim_start().splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("TYPE"), Some(name), Some(ty)) => self.open_family(name, ty.trim()),
            (Some("HELP"), Some(name), help) => {
                if self.pending_help.is_some() || self.families.contains(name) {
                    return Err(format!("# HELP for {name} out of place"));
                }
                self.pending_help = Some((name.to_string(), help.unwrap_or("").to_string()));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn open_family(&mut self, name: &str, ty: &str) -> Result<(), String> {
        let ty = MetricType::parse(ty).ok_or_else(|| format!("unknown type {ty:?} for {name}"))?;
        if !valid_name(name, true) {
            return Err(format!("invalid metric name {name:?}"));
        }
        if self.families.contains(name) {
            return Err(format!("second # TYPE for {name}"));
        }
        let help = match self.pending_help.take() {
            Some((n, h)) if n == name => Some(h),
            Some((n, _)) => return Err(format!("# HELP for {n} not followed by its # TYPE")),
            None => None,
        };
        self.families.insert(name.to_string());
        self.scrape.families.push(Family {
            name: name.to_string(),
            ty,
            help,
            samples: Vec::new(),
        });
        Ok(())
    }

    /// A sample line: it must belong to the family opened last, and be new in it.
    fn sample(&mut self, line: &str) -> Result<(), String> {
        let sample = parse_sample(line)?;
        let name = sample.name.as_str();
        let Some(fam) = self.scrape.families.last_mut().filter(|f| belongs(name, f)) else {
            return Err(
                match self.scrape.families.iter().find(|f| belongs(name, f)) {
                    Some(f) => format!("sample {name} after family {} was closed", f.name),
                    None => format!("sample {name} has no # TYPE before it"),
                },
            );
        };
        if !self
            .series
            .insert((sample.name.clone(), sorted(&sample.labels)))
        {
            return Err(format!("series {name}{:?} repeated", sample.labels));
        }
        fam.samples.push(sample);
        Ok(())
    }
}

fn sorted(labels: &Labels) -> Labels {
    let mut l = labels.clone();
    l.sort();
    l
}

/// `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_name(name, true) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let (labels, rest) = match line[name_end..].trim_start().strip_prefix('{') {
        Some(r) => parse_labels(r)?,
        None => (Vec::new(), &line[name_end..]),
    };
    let mut fields = rest.split_whitespace();
    let value = fields
        .next()
        .and_then(parse_value)
        .ok_or_else(|| format!("{name}: missing or malformed value"))?;
    if let Some(ts) = fields.next()
        && ts.parse::<i64>().is_err()
    {
        return Err(format!("{name}: malformed timestamp {ts:?}"));
    }
    if fields.next().is_some() {
        return Err(format!("{name}: trailing text after the value"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Each series of histogram `f` (its `_count` labels) must have buckets in increasing `le` order,
/// never decreasing, ending in a `+Inf` bucket equal to its `_count`. One pass groups the
/// buckets by series.
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
    /// A series' buckets so far: last `le`, last cumulative count, the `+Inf` count.
    struct Buckets {
        last: f64,
        prev_n: f64,
        inf: Option<f64>,
    }
    // Only series with a `_count` are checked (as they always were).
    let mut series: HashMap<Labels, (f64, Buckets)> = f
        .samples
        .iter()
        .filter(|s| s.name == count)
        .map(|c| {
            let empty = Buckets {
                last: f64::NEG_INFINITY,
                prev_n: 0.0,
                inf: None,
            };
            (series_key(c), (c.value, empty))
        })
        .collect();
    for b in f.samples.iter().filter(|s| s.name == bucket) {
        let Some((_, s)) = series.get_mut(&series_key(b)) else {
            continue;
        };
        let le = b
            .label("le")
            .and_then(parse_value)
            .ok_or_else(|| format!("{bucket}: missing or bad le"))?;
        if le <= s.last || b.value < s.prev_n {
            return Err(format!("{bucket}: buckets out of order or decreasing"));
        }
        (s.last, s.prev_n) = (le, b.value);
        if le == f64::INFINITY {
            s.inf = Some(b.value);
        }
    }
    if series.values().any(|(n, s)| s.inf != Some(*n)) {
        return Err(format!(
            "{}: +Inf bucket missing or not equal to _count",
            f.name
        ));
    }
    Ok(())
}
