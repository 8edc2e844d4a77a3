//! Reports: a table per policy × signal, JSON for machines, and SVG plots for people (TTFT CDF per
//! variant; p99 TTFT against load level for a sweep). No plotting dependency: the SVG is written
//! directly.

use crate::sim::{Outcome, quantile};
use serde_json::{Value, json};
use std::fmt::Write;

/// One row of a report.
pub struct Row {
    pub label: String,
    pub load: f64,
    pub outcome: Outcome,
}

pub fn row_json(r: &Row) -> Value {
    let o = &r.outcome;
    json!({
        "variant": r.label,
        "load": r.load,
        "ttft_p50_s": quantile(&o.ttft, 0.5),
        "ttft_p90_s": quantile(&o.ttft, 0.9),
        "ttft_p99_s": quantile(&o.ttft, 0.99),
        "ttft_floor_p99_s": quantile(&o.ttft_floor, 0.99),
        "wait_p99_s": quantile(&o.waits(), 0.99),
        "e2e_p99_s": quantile(&o.e2e, 0.99),
        "throughput_rps": o.completed as f64 / o.makespan.max(1e-9),
        "completed": o.completed,
        "submitted": o.submitted,
        "queue_cv": o.queue_cv,
        "fallback_fraction": if o.decisions == 0 { 0.0 } else { o.fallback_decisions as f64 / o.decisions as f64 },
    })
}

pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<24} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}\n",
        "variant",
        "load",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "wait p99",
        "E2E p99",
        "req/s",
        "queue CV",
        "fallback"
    );
    for r in rows {
        let j = row_json(r);
        let f = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        // The in-flight signal never uses engine load, so "fallback" says nothing there.
        let fallback = if r.label.ends_with("inflight") {
            "-".to_string()
        } else {
            format!("{:.1}%", f("fallback_fraction") * 100.0)
        };
        let _ = writeln!(
            s,
            "{:<24} {:>5.2} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2}s {:>8.2} {:>9.3} {:>9}",
            r.label,
            r.load,
            f("ttft_p50_s"),
            f("ttft_p90_s"),
            f("ttft_p99_s"),
            f("wait_p99_s"),
            f("e2e_p99_s"),
            f("throughput_rps"),
            f("queue_cv"),
            fallback
        );
    }
    if let Some(r) = rows.first() {
        let _ = writeln!(
            s,
            "TTFT floor p99 {:.3}s: the same requests alone on an idle engine (own prefill); \
             \"wait\" is TTFT minus that floor, the part routing can change.",
            quantile(&r.outcome.ttft_floor, 0.99)
        );
    }
    s
}

const COLORS: [&str; 6] = [
    "#6b7280", "#f59e0b", "#2563eb", "#10b981", "#7c3aed", "#dc2626",
];

fn svg_frame(
    title: &str,
    x_label: &str,
    y_label: &str,
    body: &str,
    legend: &[(String, &str)],
) -> String {
    let mut s = String::from(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="720" height="440" font-family="sans-serif" font-size="12">"#,
    );
    let _ = write!(
        s,
        r#"<rect width="720" height="440" fill="white"/><text x="360" y="24" text-anchor="middle" font-size="15">{title}</text>"#
    );
    let _ = write!(
        s,
        r#"<line x1="70" y1="380" x2="690" y2="380" stroke="black"/><line x1="70" y1="50" x2="70" y2="380" stroke="black"/>"#
    );
    let _ = write!(
        s,
        r#"<text x="380" y="420" text-anchor="middle">{x_label}</text><text x="18" y="215" transform="rotate(-90 18 215)" text-anchor="middle">{y_label}</text>"#
    );
    s.push_str(body);
    for (i, (name, color)) in legend.iter().enumerate() {
        let y = 60 + i as i32 * 18;
        let _ = write!(
            s,
            r#"<rect x="480" y="{}" width="12" height="12" fill="{color}"/><text x="498" y="{}">{name}</text>"#,
            y - 10,
            y
        );
    }
    s.push_str("</svg>\n");
    s
}

/// TTFT CDFs of every row (log-scaled x axis, seconds).
pub fn cdf_svg(title: &str, rows: &[Row]) -> String {
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.outcome.ttft.iter().copied())
        .filter(|x| *x > 0.0)
        .collect();
    let (lo, hi) = (
        quantile(&all, 0.0).max(1e-3).log10(),
        quantile(&all, 1.0).max(1e-2).log10() + 0.05,
    );
    let x = |v: f64| 70.0 + (v.max(1e-3).log10() - lo) / (hi - lo) * 620.0;
    let mut body = String::new();
    for k in (lo.floor() as i32)..=(hi.ceil() as i32) {
        let v = 10f64.powi(k);
        if v.log10() >= lo && v.log10() <= hi {
            let _ = write!(
                body,
                r#"<line x1="{0:.1}" y1="380" x2="{0:.1}" y2="385" stroke="black"/><text x="{0:.1}" y="398" text-anchor="middle">{1}</text>"#,
                x(v),
                v
            );
        }
    }
    for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
        let y = 380.0 - q * 330.0;
        let _ = write!(
            body,
            r##"<line x1="66" y1="{y:.1}" x2="690" y2="{y:.1}" stroke="#eee"/><text x="62" y="{:.1}" text-anchor="end">{q}</text>"##,
            y + 4.0
        );
    }
    let mut legend = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let mut v = r.outcome.ttft.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1);
        let step = (n / 400).max(1);
        let pts: String = (0..n)
            .step_by(step)
            .chain(std::iter::once(n - 1))
            .filter_map(|k| {
                v.get(k).map(|t| {
                    format!(
                        "{:.1},{:.1} ",
                        x(*t),
                        380.0 - (k + 1) as f64 / n as f64 * 330.0
                    )
                })
            })
            .collect();
        let color = COLORS[i % COLORS.len()];
        let _ = write!(
            body,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>"#
        );
        legend.push((r.label.clone(), color));
    }
    svg_frame(
        title,
        "time to first token (s, log scale)",
        "fraction of requests",
        &body,
        &legend,
    )
}

/// p99 TTFT against load level, one line per variant (rows grouped by label).
pub fn sweep_svg(title: &str, rows: &[Row]) -> String {
    let mut labels: Vec<String> = Vec::new();
    for r in rows {
        if !labels.contains(&r.label) {
            labels.push(r.label.clone());
        }
    }
    let p99s: Vec<f64> = rows
        .iter()
        .map(|r| quantile(&r.outcome.ttft, 0.99))
        .collect();
    let (lmin, lmax) = rows.iter().fold((f64::MAX, f64::MIN), |(a, b), r| {
        (a.min(r.load), b.max(r.load))
    });
    let ymax = p99s
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(1e-3);
    let x = |l: f64| 70.0 + (l - lmin) / (lmax - lmin).max(1e-9) * 620.0;
    let y = |v: f64| 380.0 - (v / ymax).min(1.0) * 330.0;
    let mut body = String::new();
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let _ = write!(
            body,
            r##"<line x1="66" y1="{0:.1}" x2="690" y2="{0:.1}" stroke="#eee"/><text x="62" y="{1:.1}" text-anchor="end">{2:.2}</text>"##,
            y(v),
            y(v) + 4.0,
            v
        );
    }
    let mut legend = Vec::new();
    for (i, l) in labels.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: String = rows
            .iter()
            .zip(&p99s)
            .filter(|(r, _)| &r.label == l)
            .map(|(r, p)| format!("{:.1},{:.1} ", x(r.load), y(*p)))
            .collect();
        let _ = write!(
            body,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>"#
        );
        legend.push((l.clone(), color));
    }
    for r in rows
        .iter()
        .filter(|r| &r.label == labels.first().unwrap_or(&String::new()))
    {
        let _ = write!(
            body,
            r#"<text x="{:.1}" y="398" text-anchor="middle">{:.2}</text>"#,
            x(r.load),
            r.load
        );
    }
    svg_frame(
        title,
        "offered load (fraction of nominal capacity)",
        "p99 TTFT (s)",
        &body,
        &legend,
    )
}
