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

mod parse;
mod write;

/// Declares a label-set struct and its [`LabelSet`] impl in one go: each field is a label of the
/// same name, written with its `Display`.
///
/// ```
/// loadlink_wire::label_set! {
///     /// `{worker="URL",rank="R"}`.
///     pub struct RankLabels<'a> { worker: &'a str, rank: usize }
/// }
/// ```
#[macro_export]
macro_rules! label_set {
    ($(#[$m:meta])* $vis:vis struct $name:ident $(<$lt:lifetime>)? { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        $vis struct $name $(<$lt>)? {
            $($vis $field: $ty,)*
        }

        impl $(<$lt>)? $crate::prom::LabelSet for $name $(<$lt>)? {
            fn write_labels(&self, w: &mut $crate::prom::LabelWriter<'_>) {
                $(w.label(stringify!($field), &self.$field);)*
            }
        }
    };
}

pub use parse::{Family, ParseError, Sample, Scrape, parse};
pub use write::{Exposition, FamilyWriter, LabelSet, LabelWriter, MetricType, Number};

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
