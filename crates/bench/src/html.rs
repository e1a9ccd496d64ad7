//! report.html: one self-contained page (inline CSS and SVG, no scripts, no
//! external files) rendered from results.json. Per scenario: a bar per tool
//! (the suite's measure: mean Mbit/s, or seconds where time separates the
//! tools) beside the study's own figures, what each receiver's link delivered
//! over time (the whole run, and its first seconds drawn large), and every
//! run's numbers. A dissemination scenario (runs with [`Run::feed`]) has no
//! bars and no overview row: per receiver, its latency over time and its
//! latency distribution, and tables of what the sender and each receiver
//! did.
//!
//! Layout: every text of free length (tool, scenario and series names,
//! titles, legends, values) is HTML, which the browser flows and wraps;
//! the SVG plots hold only marks and numeric tick labels, whose widths are
//! bounded and allowed for. So nothing clips or overlaps however long a name
//! is; `tests/report_browser.rs` checks that in Chromium.

use crate::results::{
    axes, cell_of, jain_text, kept_text, rate_text, runs_of, share_text, FeedReceiver, Results,
    Run, Status,
};
use crate::scenario::{down_rate_bps, mtu_note, Metric, Published, Sweep};
use crate::text::{
    feed_cells, fmt_num, is_feed, latency_text, metric_text, rss_text, secs_text, CPU_NOTE,
};
use std::fmt::Write as _;

/// Tableau 10: a tool keeps its colour in every chart of the page.
const COLORS: [&str; 10] = [
    "#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
    "#ff9da7", "#bab0ac",
];
/// Study series that no lab tool replays.
const STUDY_GREY: &str = "#555555";
/// Line styles that tell one receiver of a tool from another.
const DASHES: [&str; 4] = ["", "7 3", "2 3", "10 3 2 3"];
/// The background traffic's line beside a tool's own (the tool's colour).
const BACKGROUND_DASH: &str = "1 2";

/// HTML-escaped text. The reports' time-cap mark (an emoji, fine in markdown)
/// becomes a dagger: a browser without an emoji font draws the emoji as a box.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\u{23f1}', "\u{2020}")
}

fn color(tools: &[String], tool: &str) -> &'static str {
    let i = tools.iter().position(|t| t == tool).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

/// The smallest 1-2-5 step that cuts `span` into at most `max_n` parts.
fn nice_step(span: f64, max_n: usize) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / max_n.max(1) as f64;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&m| m >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// A value axis from 0: its top (a multiple of the step, at or above `hi`)
/// and its ticks.
fn value_ticks(hi: f64, max_n: usize) -> (f64, Vec<f64>) {
    let step = nice_step(hi, max_n);
    let n = (hi / step - 1e-9).ceil().max(1.0) as usize;
    (step * n as f64, (0..=n).map(|k| step * k as f64).collect())
}

/// Ticks of a time axis that ends exactly at `end`: multiples of a 1-2-5
/// step up to `end`.
fn time_ticks(end: f64, max_n: usize) -> Vec<f64> {
    let step = nice_step(end, max_n);
    let n = (end / step + 1e-9).floor() as usize;
    (0..=n).map(|k| step * k as f64).collect()
}

/// A log axis covering `lo..hi`: whole decades, with 2 and 5 between them
/// when it spans one, 3 when it spans two (evenly spaced: "500" and "1000"
/// would touch on a narrow page), every other decade when more than six.
fn log_ticks(lo: f64, hi: f64) -> (f64, f64, Vec<f64>) {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let b = b.max(a + 1);
    let mut t: Vec<f64> = (a..=b).map(|k| 10f64.powi(k)).collect();
    if b - a <= 2 {
        let between: &[f64] = if b - a == 1 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0, 3.0]
        };
        t = (a..b)
            .flat_map(|k| between.iter().map(move |m| m * 10f64.powi(k)))
            .chain([10f64.powi(b)])
            .collect();
    } else if b - a > 6 {
        t = (a..=b)
            .filter(|k| (k - a) % 2 == 0 || *k == b)
            .map(|k| 10f64.powi(k))
            .collect();
    }
    (10f64.powi(a), 10f64.powi(b), t)
}

/// A tick label: as many decimals as the step needs, no more.
fn tick_text(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// A value axis: log over the decades from `lo` (the least positive value)
/// to `hi` where `log` asks for it and the values allow it, else linear from
/// 0 to a 1-2-5 step at or above `hi`, in at most `max_n` steps.
struct ValueAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    step: f64,
    log: bool,
}

impl ValueAxis {
    fn new(lo: f64, hi: f64, log: bool, max_n: usize) -> ValueAxis {
        if log && lo.is_finite() && lo > 0.0 && hi > 0.0 {
            let (lo, hi, ticks) = log_ticks(lo, hi);
            return ValueAxis {
                lo,
                hi,
                ticks,
                step: 0.0,
                log: true,
            };
        }
        let (top, ticks) = value_ticks(if hi > 0.0 { hi } else { 1.0 }, max_n);
        ValueAxis {
            lo: 0.0,
            hi: top,
            step: ticks.get(1).copied().unwrap_or(top),
            ticks,
            log: false,
        }
    }

    /// A tick's label.
    fn label(&self, v: f64) -> String {
        if self.log {
            fmt_num(v)
        } else {
            tick_text(v, self.step)
        }
    }

    /// Where `v` falls on it, 0 to 1.
    fn frac(&self, v: f64) -> f64 {
        frac(v, self.lo, self.hi, self.log).unwrap_or(0.0)
    }
}

/// Where `v` falls on an axis from `a` to `b` (0 to 1), linear or log; None
/// for an empty axis.
fn frac(v: f64, a: f64, b: f64, log: bool) -> Option<f64> {
    if b <= a {
        None
    } else if log {
        Some((v.max(a) / a).log10() / (b / a).log10())
    } else {
        Some((v - a) / (b - a))
    }
}

/// Width in px of a tick label at the charts' 11 px: digits and points of a
/// sans-serif face are under 0.6 em; 0.64 leaves room for wider faces.
fn text_w(s: &str) -> f64 {
    s.chars().count() as f64 * 11.0 * 0.64
}

/// A rate axis's unit: kbit/s where the rates stay below 1 Mbit/s.
#[derive(Clone, Copy)]
struct RateUnit {
    per_mbps: f64,
    name: &'static str,
}

fn rate_unit(peak_mbps: f64) -> RateUnit {
    if peak_mbps > 0.0 && peak_mbps < 1.0 {
        RateUnit {
            per_mbps: 1e3,
            name: "kbit/s",
        }
    } else {
        RateUnit {
            per_mbps: 1.0,
            name: "Mbit/s",
        }
    }
}

/// One line of a chart.
struct Line {
    label: String,
    color: &'static str,
    dash: &'static str,
    points: Vec<(f64, f64)>,
    /// A dot per point (sweeps); hollow for the study's figures.
    markers: bool,
    hollow: bool,
}

/// How a line chart's x axis runs.
enum XAxis {
    /// Time from 0, ending exactly at the longest run (or the window shown).
    Time { end: f64 },
    /// The sweep's x, linear or log.
    Values { lo: f64, hi: f64, log: bool },
}

/// A line chart: the SVG plot (marks and numeric ticks only), its caption,
/// x title and legend in HTML.
struct LineChart<'a> {
    kind: &'static str,
    scenario: &'a str,
    caption: String,
    x_title: String,
    x: XAxis,
    y_log: bool,
    lines: Vec<Line>,
}

thread_local! {
    /// The next chart's clip-path id in the page being rendered.
    static CHART_ID: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

const W: f64 = 640.0;
const PH: f64 = 200.0;

fn line_chart(c: &LineChart) -> String {
    let ys: Vec<f64> = c
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .collect();
    let hi = ys.iter().copied().fold(0.0, f64::max);
    let lo_pos = ys
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // y: from 0, or log over the decades the values span.
    let y = ValueAxis::new(lo_pos, hi, c.y_log, 5);
    let y_labels: Vec<String> = y.ticks.iter().map(|v| y.label(*v)).collect();
    let left = 10.0 + y_labels.iter().map(|s| text_w(s)).fold(0.0, f64::max);
    let top = 10.0;
    // x: ticks that fit the width with room between their labels.
    let x_ticks = |pw: f64| -> (Vec<f64>, Vec<String>, f64, f64) {
        match c.x {
            XAxis::Time { end } => {
                let end = if end > 0.0 { end } else { 1.0 };
                let w = text_w(&tick_text(end, nice_step(end, 8))) + 16.0;
                let n = ((pw / w).floor() as usize).clamp(2, 10);
                let t = time_ticks(end, n);
                let step = t.get(1).copied().unwrap_or(end);
                let l = t.iter().map(|v| tick_text(*v, step)).collect();
                (t, l, 0.0, end)
            }
            XAxis::Values { lo, hi, log } if log => {
                let (a, b, t) = log_ticks(lo, hi);
                let l = t.iter().map(|v| fmt_num(*v)).collect();
                (t, l, a, b)
            }
            XAxis::Values { lo, hi, .. } => {
                let (lo, hi) = if hi > lo {
                    (lo, hi)
                } else {
                    (lo - 1.0, lo + 1.0)
                };
                let w = text_w(&fmt_num(hi)) + 16.0;
                let n = ((pw / w).floor() as usize).clamp(2, 10);
                let step = nice_step(hi - lo, n);
                let first = (lo / step).floor() * step;
                let last = (hi / step).ceil() * step;
                let k = ((last - first) / step).round() as usize;
                let t: Vec<f64> = (0..=k).map(|i| first + step * i as f64).collect();
                let l = t.iter().map(|v| tick_text(*v, step)).collect();
                (t, l, first, last)
            }
        }
    };
    let (_, labels0, _, _) = x_ticks(W - left - 40.0);
    let right = labels0
        .last()
        .map_or(8.0, |s| text_w(s) / 2.0 + 6.0)
        .max(8.0);
    let pw = W - left - right;
    let (xt, x_labels, x0, x1) = x_ticks(pw);
    let x_log = matches!(c.x, XAxis::Values { log: true, .. });
    let px = |v: f64| left + frac(v, x0, x1, x_log).unwrap_or(0.5) * pw;
    let py = |v: f64| top + PH - y.frac(v) * PH;
    // The x labels' baseline: far enough below the axis that the lowest y
    // label (centred on it) and the first x label never touch.
    let x_base = top + PH + 18.0;
    let h = x_base + 6.0;
    // Unique in the page (a sweep draws a chart per metric), counted from 0
    // in each render.
    let id = format!("clip-{}", CHART_ID.with(|c| c.replace(c.get() + 1)));
    let mut s = format!(
        r##"<figure class="chart {kind}" data-scenario="{sc}"><figcaption>{cap}</figcaption><svg viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="{cap_plain}"><defs><clipPath id="{id}"><rect x="{left:.1}" y="{top}" width="{pw:.1}" height="{PH}"/></clipPath></defs><rect class="plot-area" x="{left:.1}" y="{top}" width="{pw:.1}" height="{PH}" fill="none" stroke="#bbb"/>"##,
        kind = c.kind,
        sc = esc(c.scenario),
        cap = c.caption,
        cap_plain = c.caption.replace(['<', '>', '"'], ""),
    );
    for (v, label) in y.ticks.iter().zip(&y_labels) {
        let _ = write!(
            s,
            r##"<line x1="{left:.1}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#e6e6e6"/><text class="tick y" x="{2:.1}" y="{3:.1}" text-anchor="end">{label}</text>"##,
            py(*v),
            left + pw,
            left - 5.0,
            py(*v) + 4.0,
        );
    }
    for (v, label) in xt.iter().zip(&x_labels) {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#f0f0f0"/><text class="tick x" x="{0:.1}" y="{2:.1}" text-anchor="middle">{label}</text>"##,
            px(*v),
            top + PH,
            x_base,
        );
    }
    let _ = write!(s, r#"<g clip-path="url(#{id})">"#);
    for l in &c.lines {
        let pts: String = l
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1} ", px(*x), py(*y)))
            .collect();
        let dash = if l.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, l.dash)
        };
        let _ = write!(
            s,
            r#"<polyline points="{pts}" fill="none" stroke="{}" stroke-width="1.8"{dash}><title>{}</title></polyline>"#,
            l.color,
            esc(&l.label)
        );
        if l.markers {
            for (x, y) in &l.points {
                let fill = if l.hollow { "#fff" } else { l.color };
                let _ = write!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{fill}" stroke="{}" stroke-width="1.5"><title>{}: {} at {}</title></circle>"#,
                    px(*x),
                    py(*y),
                    l.color,
                    esc(&l.label),
                    fmt_num(*y),
                    fmt_num(*x)
                );
            }
        }
    }
    s.push_str("</g></svg>");
    let _ = write!(s, r#"<div class="xtitle">{}</div>"#, esc(&c.x_title));
    legend(&mut s, &c.lines);
    s.push_str("</figure>");
    s
}

/// The legend under a chart: HTML, so that it wraps.
fn legend(s: &mut String, lines: &[Line]) {
    s.push_str(r#"<ul class="legend">"#);
    for l in lines {
        let dash = if l.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, l.dash)
        };
        let _ = write!(
            s,
            r#"<li><svg width="26" height="10" aria-hidden="true"><line x1="1" y1="5" x2="25" y2="5" stroke="{}" stroke-width="2.5"{dash}/></svg><span class="name">{}</span></li>"#,
            l.color,
            esc(&l.label)
        );
    }
    s.push_str("</ul>");
}

/// One row of a bar chart.
struct Bar {
    name: String,
    value: Option<f64>,
    /// The value's text, or why there is none.
    text: String,
    color: &'static str,
    study: bool,
}

/// Horizontal bars in HTML (a CSS grid: name, bar, value), on a linear or a
/// log scale; `target` draws a dashed line.
fn bar_chart(
    scenario: &str,
    caption: &str,
    bars: &[Bar],
    floor: f64,
    target: Option<f64>,
) -> String {
    let vals: Vec<f64> = bars.iter().filter_map(|b| b.value).collect();
    let data_top = vals.iter().copied().fold(0.0, f64::max);
    let top = data_top.max(target.unwrap_or(0.0)).max(floor);
    let low = vals
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // Values more than 50x apart (as in seed 000's histograms) get a log
    // axis, so that the small bars do not vanish.
    let x = ValueAxis::new(low, top, low.is_finite() && data_top / low > 50.0, 4);
    let pct = |v: f64| (x.frac(v) * 100.0).clamp(0.0, 100.0);
    let mut s = format!(
        r#"<figure class="chart bars" data-scenario="{}"><figcaption>{caption}{}</figcaption><div class="grid">"#,
        esc(scenario),
        if x.log { " (log scale)" } else { "" }
    );
    let target_mark = target
        .filter(|t| *t >= x.lo && *t <= x.hi)
        .map_or(String::new(), |t| {
            format!(
                r#"<span class="target" style="left:{:.2}%"></span>"#,
                pct(t)
            )
        });
    for b in bars {
        let row = if b.study { " study" } else { "" };
        let _ = write!(
            s,
            r#"<span class="name{row}">{}</span><span class="track{row}">"#,
            esc(&b.name)
        );
        if let Some(v) = b.value {
            let _ = write!(
                s,
                r#"<span class="bar" style="width:{:.2}%;--c:{}" title="{}: {}"></span>"#,
                pct(v).max(0.3),
                b.color,
                esc(&b.name),
                esc(&b.text)
            );
        }
        s.push_str(&target_mark);
        let class = if b.value.is_some() {
            "val"
        } else {
            "val missing"
        };
        let _ = write!(s, r#"</span><span class="{class}">{}</span>"#, esc(&b.text));
    }
    s.push_str(r#"<span></span><span class="track axis">"#);
    for v in &x.ticks {
        let _ = write!(
            s,
            r#"<span class="tk" style="left:{:.2}%">{}</span>"#,
            pct(*v),
            x.label(*v)
        );
    }
    s.push_str("</span><span></span></div></figure>");
    s
}

/// The suite's measure: what the overview and the bars show.
fn measure(r: &Results) -> Metric {
    r.suite.suite.measure
}

/// A scenario's link rate, Mbit/s (the receivers' down direction, the
/// slowest; the suite's line rate where its links set none).
fn link_mbps(r: &Results, first: &Run) -> f64 {
    down_rate_bps(first.link.split(" | ")).unwrap_or(r.line_rate_bps) as f64 / 1e6
}

/// The largest round-trip time of a run's receivers' links.
fn rtt_s(first: &Run) -> f64 {
    first
        .link
        .split(" | ")
        .filter_map(|l| l.parse::<longhaul_netem::LinkSpec>().ok())
        .map(|l| (l.up.delay_ns + l.down.delay_ns) as f64 / 1e9)
        .fold(0.0, f64::max)
}

/// The published figures for a scenario.
fn published_for<'a>(r: &'a Results, scenario: &str) -> Vec<&'a Published> {
    r.suite
        .published
        .iter()
        .filter(|p| p.scenario == scenario)
        .collect()
}

/// The colour of a study's series: its lab tool's, else grey.
fn study_color(tools: &[String], p: &Published) -> &'static str {
    match &p.tool {
        Some(t) if tools.contains(t) => color(tools, t),
        _ => STUDY_GREY,
    }
}

/// The bars of one scenario: each tool's measure, then the study's figures
/// in the same measure.
fn scenario_bars(r: &Results, sc: &str, tools: &[String], first: &Run) -> String {
    let m = measure(r);
    let mut bars: Vec<Bar> = tools
        .iter()
        .filter_map(|t| {
            let runs = runs_of(r, sc, t);
            (!runs.is_empty()).then(|| {
                let (v, note) = cell_of(&runs, m);
                Bar {
                    name: t.clone(),
                    value: v,
                    text: v.map_or(note.trim().to_string(), |v| {
                        format!("{}{note}", metric_text(m, v))
                    }),
                    color: color(tools, t),
                    study: false,
                }
            })
        })
        .collect();
    for p in published_for(r, sc).into_iter().filter(|p| p.metric == m) {
        bars.push(Bar {
            name: format!("study: {}", p.series),
            value: Some(p.value),
            text: metric_text(m, p.value),
            color: study_color(tools, p),
            study: true,
        });
    }
    let link = link_mbps(r, first);
    // Rates below 1 Mbit/s: the axis in kbit/s, as the values read.
    let unit = rate_unit(
        bars.iter()
            .filter_map(|b| b.value)
            .fold(0.0, f64::max)
            .max(r.suite.suite.target_mbps.unwrap_or(0.0)),
    );
    let caption = match m {
        Metric::Seconds => {
            "Seconds to move the data set, per tool (mean of its measured runs; shorter is better)"
                .to_string()
        }
        _ => {
            let mut c = format!("{} per tool (mean of its measured runs)", unit.name);
            if let Some(t) = r.suite.suite.target_mbps {
                let _ = write!(c, "; dashed: the target, {} Mbit/s", fmt_num(t));
            }
            c
        }
    };
    let (floor, target) = match m {
        // At least a tenth of the link's rate, so that a few Mbit/s do not
        // fill the chart.
        Metric::Mbps => {
            for b in &mut bars {
                b.value = b.value.map(|v| v * unit.per_mbps);
            }
            (
                link / 10.0 * unit.per_mbps,
                r.suite.suite.target_mbps.map(|t| t * unit.per_mbps),
            )
        }
        _ => (0.0, None),
    };
    bar_chart(sc, &esc(&caption), &bars, floor, target)
}

/// A sweep: the metric against the scenarios' x, a line per tool (mean of
/// its measured runs; a point is left out where a tool has none), and the
/// study's published figures as hollow dashed lines.
fn sweep_chart(r: &Results, name: &str, sw: &Sweep, metric: Metric, tools: &[String]) -> String {
    let mut xs: Vec<(String, f64)> = Vec::new();
    for x in r.runs.iter().filter(|x| x.sweep.as_deref() == Some(name)) {
        if let Some(v) = x.x {
            if !xs.iter().any(|(sc, _)| *sc == x.scenario) {
                xs.push((x.scenario.clone(), v));
            }
        }
    }
    if xs.is_empty() {
        return String::new();
    }
    xs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let unit = rate_unit(
        r.runs
            .iter()
            .filter(|x| x.sweep.as_deref() == Some(name))
            .map(|x| x.mbps)
            .fold(0.0, f64::max),
    );
    let scale = if metric == Metric::Mbps {
        unit.per_mbps
    } else {
        1.0
    };
    let mut lines: Vec<Line> = tools
        .iter()
        .map(|t| Line {
            label: t.clone(),
            color: color(tools, t),
            dash: "",
            points: xs
                .iter()
                .filter_map(|(sc, xv)| {
                    cell_of(&runs_of(r, sc, t), metric)
                        .0
                        .map(|m| (*xv, m * scale))
                })
                .collect(),
            markers: true,
            hollow: false,
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    let mut study: Vec<Line> = Vec::new();
    for (sc, xv) in &xs {
        for p in published_for(r, sc)
            .into_iter()
            .filter(|p| p.metric == metric)
        {
            let label = format!("study: {}", p.series);
            let pt = (*xv, p.value * scale);
            match study.iter_mut().find(|l| l.label == label) {
                Some(l) => l.points.push(pt),
                None => study.push(Line {
                    label,
                    color: study_color(tools, p),
                    dash: "5 4",
                    points: vec![pt],
                    markers: true,
                    hollow: true,
                }),
            }
        }
    }
    lines.extend(study);
    let (x0, x1) = (xs[0].1, xs[xs.len() - 1].1);
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .collect();
    let spread =
        ys.iter().copied().fold(0.0, f64::max) / ys.iter().copied().fold(f64::INFINITY, f64::min);
    let y_log = matches!(metric, Metric::Mbps | Metric::Seconds) && spread > 30.0;
    let what = match metric {
        Metric::Mbps => unit.name,
        m => m.label(),
    };
    line_chart(&LineChart {
        kind: "sweep",
        scenario: name,
        caption: format!("{}{}", esc(what), if y_log { " (log scale)" } else { "" }),
        x_title: sw.x.clone(),
        x: XAxis::Values {
            lo: x0,
            hi: x1,
            log: sw.log_x && x0 > 0.0,
        },
        y_log,
        lines,
    })
}

/// Mean of every `k` values (the last group may be shorter).
fn smooth(v: &[f64], k: usize) -> Vec<f64> {
    v.chunks(k.max(1))
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect()
}

/// The short label of each receiver: what its link has that the others'
/// do not ("loss=1e-2"), else its number.
fn receiver_labels(link: &str, n: usize) -> Vec<String> {
    let links: Vec<Vec<&str>> = link
        .split(" | ")
        .map(|l| l.split_whitespace().collect())
        .collect();
    (0..n)
        .map(|i| {
            let own: Vec<&str> = links.get(i).map_or(Vec::new(), |l| {
                l.iter()
                    .filter(|t| !links.iter().all(|o| o.contains(t)))
                    .copied()
                    .collect()
            });
            if own.is_empty() {
                format!("receiver {}", i + 1)
            } else {
                format!("receiver {} ({})", i + 1, own.join(" "))
            }
        })
        .collect()
}

/// What the receivers' links delivered over time, for each tool's first run:
/// the whole run (time axis to the longest), then its first seconds large.
fn series(r: &Results, sc: &str, tools: &[String], first: &Run) -> String {
    let runs: Vec<&Run> = tools
        .iter()
        .filter_map(|t| {
            r.runs
                .iter()
                .find(|x| x.scenario == sc && &x.tool == t && !x.series_mbps.is_empty())
        })
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let link = link_mbps(r, first);
    let peak = runs
        .iter()
        .flat_map(|x| x.series_mbps.iter().copied())
        .fold(0.0, f64::max);
    let unit = rate_unit(link.min(peak.max(link / 10.0)));
    // At low rates a 100 ms bin holds a few packets: average over a window
    // that holds about 30 full-size packets at the link's rate.
    let pkt_s = 30.0 * 1500.0 * 8.0 / (link * 1e6);
    let window = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|w| *w >= pkt_s)
        .unwrap_or(10.0);
    // The time axis ends at the longest run (its wall time; the series may
    // hold a bin or two from before the start and after the end).
    let longest = runs
        .iter()
        .map(|x| {
            if x.wall_s > 0.0 {
                x.wall_s
            } else {
                x.series_mbps.len() as f64 * 0.1
            }
        })
        .fold(0.0, f64::max);
    // No more than ~900 points a line.
    let mut k = (window / 0.1).round() as usize;
    k = k.max((longest / 0.1 / 900.0).ceil() as usize);
    let lines_of = |k: usize, upto: f64| -> Vec<Line> {
        let mut lines = Vec::new();
        for x in &runs {
            let c = color(tools, &x.tool);
            let own: Vec<(String, &Vec<f64>, &'static str)> = if x.receiver_series_mbps.len() > 1 {
                let labels = receiver_labels(&x.link, x.receiver_series_mbps.len());
                x.receiver_series_mbps
                    .iter()
                    .zip(labels)
                    .enumerate()
                    .map(|(i, (s, l))| (format!("{}, {l}", x.tool), s, DASHES[i % DASHES.len()]))
                    .collect()
            } else {
                vec![(x.tool.clone(), &x.series_mbps, "")]
            };
            // Beside background traffic: what the background got meanwhile,
            // in the tool's colour (how much a start took from a full link).
            let own = own
                .into_iter()
                .chain((!x.background_series_mbps.is_empty()).then(|| {
                    (
                        format!("background beside {}", x.tool),
                        &x.background_series_mbps,
                        BACKGROUND_DASH,
                    )
                }));
            for (label, s, dash) in own {
                let n = ((upto / 0.1 - 1e-9).ceil() as usize).min(s.len());
                let pts = smooth(&s[..n], k)
                    .into_iter()
                    .enumerate()
                    .map(|(j, v)| {
                        let t = ((j * k) as f64 + (k.min(n - j * k)) as f64 / 2.0) * 0.1;
                        (t, v * unit.per_mbps)
                    })
                    .collect();
                lines.push(Line {
                    label,
                    color: c,
                    dash,
                    points: pts,
                    markers: false,
                    hollow: false,
                });
            }
        }
        lines
    };
    let per = |k: usize| {
        let w = k as f64 * 0.1;
        if k == 1 {
            "100 ms".to_string()
        } else if w < 1.0 {
            format!("{:.0} ms (mean of the 100 ms series)", w * 1e3)
        } else {
            format!("{} s (mean of the 100 ms series)", fmt_num(w))
        }
    };
    let many = runs.iter().any(|x| x.receiver_series_mbps.len() > 1);
    let whom = if many {
        "each receiver's link delivered"
    } else {
        "the receiver's link delivered"
    };
    let mut s = line_chart(&LineChart {
        kind: "series",
        scenario: sc,
        caption: format!(
            "{}, per {}: what {whom}, over the whole run (each tool's first run)",
            unit.name,
            per(k)
        ),
        x_title: "seconds".into(),
        x: XAxis::Time { end: longest },
        y_log: false,
        lines: lines_of(k, longest),
    });
    // Start-up: the first ten round trips (at least 2 s), where they are a
    // small part of the run.
    let rtt = rtt_s(first);
    let span = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0]
        .into_iter()
        .find(|w| *w >= (10.0 * rtt).max(2.0))
        .unwrap_or(60.0);
    if span <= longest * 0.5 {
        let ks =
            ((window / 0.1).round() as usize).min(((span / 0.1) / 20.0).floor().max(1.0) as usize);
        s.push_str(&line_chart(&LineChart {
            kind: "startup",
            scenario: sc,
            caption: format!(
                "The first {} s drawn large{}: {}, per {}",
                fmt_num(span),
                if rtt >= 1e-3 {
                    format!(
                        " ({} round trips of {} ms)",
                        fmt_num((span / rtt).round()),
                        fmt_num(rtt * 1e3)
                    )
                } else {
                    String::new()
                },
                unit.name,
                per(ks)
            ),
            x_title: "seconds".into(),
            x: XAxis::Time { end: span },
            y_log: false,
            lines: lines_of(ks, span),
        }));
    }
    s
}

/// With several receivers: when each held the whole data set, per run.
fn receivers_done(r: &Results, sc: &str) -> String {
    let runs: Vec<&Run> = r
        .runs
        .iter()
        .filter(|x| x.scenario == sc && !x.receiver_done_s.is_empty())
        .collect();
    let Some(first) = runs.first() else {
        return String::new();
    };
    let labels = receiver_labels(&first.link, first.receiver_done_s.len());
    let mut s = String::from(
        "<p class=meta>When each receiver had the whole data set, seconds from the start: a receiver of a pull tool when its own client exited, of a multicast tool when every file was there with every byte (looked at four times a second; UFTP's once uftpd had listed every file as copied):</p><div class=scroll><table><tr><th class=l>tool</th><th>run</th>",
    );
    for l in &labels {
        let _ = write!(s, "<th>{}</th>", esc(l));
    }
    s.push_str("<th>all done</th></tr>");
    for x in runs {
        let _ = write!(s, "<tr><td>{}</td><td>{}</td>", esc(&x.tool), x.rep);
        for d in &x.receiver_done_s {
            match d {
                Some(t) => {
                    let _ = write!(s, "<td>{t:.2}</td>");
                }
                None => s.push_str("<td class=bad>not complete</td>"),
            }
        }
        if x.status == Status::Ok {
            let _ = write!(s, "<td>{:.2}</td></tr>", x.wall_s);
        } else {
            let _ = write!(s, "<td class=bad>{}</td></tr>", esc(x.status.as_str()));
        }
    }
    s.push_str("</table></div>");
    s
}

/// The receivers of a dissemination scenario, one per host in the order
/// they first appear (their link and role as its first run recorded them).
fn feed_hosts<'a>(r: &'a Results, sc: &str) -> Vec<&'a FeedReceiver> {
    let mut hosts: Vec<&FeedReceiver> = Vec::new();
    for f in r
        .runs
        .iter()
        .filter(|x| x.scenario == sc)
        .filter_map(|x| x.feed.as_ref())
    {
        for v in &f.receivers {
            if !hosts.iter().any(|h| h.host == v.host) {
                hosts.push(v);
            }
        }
    }
    hosts
}

/// A receiver as the charts title it: its host, link and role.
fn receiver_title(v: &FeedReceiver) -> String {
    let mut t = format!("{} (link {}", v.host, v.link);
    if !v.role.is_empty() {
        let _ = write!(t, "; {}", v.role);
    }
    t.push(')');
    t
}

/// A dissemination scenario's section after its heading: each run's
/// producer and sender, each receiver's products and latencies, and per
/// receiver its latency over time and its latency distribution (each
/// tool's first run with numbers).
fn feed_section(r: &Results, sc: &str, tools: &[String]) -> String {
    let mut s = String::from(
        "<p class=meta>A dissemination run: a producer writes products into the sender's spool for a set time, at a set load; receivers (some join late or are restarted) must each have every product that was ready once they had joined. Latency: from ready at the sender to verified (by hash) at the receiver, of the due products it had. RSS: resident memory of the tool's processes, MB, first sample → largest → last.</p><div class=scroll><table><tr><th class=l>tool</th><th>run</th><th class=l>status</th><th>products</th><th>MB</th><th>producer s</th><th>load Mbit/s</th><th>s</th><th>sender CPU s</th><th>sender RSS MB</th><th>receivers' CPU s</th><th>emulator CPU s</th><th>runner CPU s</th><th>machine CPU s</th><th>busiest 5 s, cores</th><th class=l>note</th></tr>",
    );
    let runs: Vec<&Run> = r.runs.iter().filter(|x| x.scenario == sc).collect();
    for x in &runs {
        let class = if x.status == Status::Ok { "ok" } else { "bad" };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td class=\"l {class}\">{}</td>",
            esc(&x.tool),
            x.rep,
            esc(x.status.as_str())
        );
        for cell in feed_cells(x) {
            let _ = write!(s, "<td>{}</td>", esc(&cell));
        }
        let _ = write!(s, "<td class=l>{}</td></tr>", esc(&x.note));
    }
    s.push_str("</table></div><div class=scroll><table><tr><th class=l>tool</th><th>run</th><th class=l>receiver</th><th class=l>link</th><th class=l>role</th><th>had/due</th><th>extra</th><th>duplicates</th><th>corrupt</th><th>latency p50 s</th><th>p99 s</th><th>max s</th><th>CPU s</th><th>RSS MB</th></tr>");
    for x in &runs {
        for v in x.feed.iter().flat_map(|f| &f.receivers) {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td class=l>{}</td><td class=link><code>{}</code></td><td class=l>{}</td><td class=\"{}\">{}/{}</td><td>{}</td><td>{}</td>{}<td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td></tr>",
                esc(&x.tool),
                x.rep,
                esc(&v.host),
                esc(&v.link),
                esc(if v.role.is_empty() { "-" } else { &v.role }),
                if v.had < v.due { "bad" } else { "ok" },
                v.had,
                v.due,
                v.extra,
                v.duplicates,
                if v.corrupt > 0 {
                    format!("<td class=bad>{}</td>", v.corrupt)
                } else {
                    "<td>0</td>".into()
                },
                latency_text(v.p50_s),
                latency_text(v.p99_s),
                latency_text(v.max_s),
                v.cpu_s,
                rss_text(&v.rss_kb, false),
            );
        }
    }
    s.push_str("</table></div>");
    // Per receiver, each tool's first run that has numbers for it.
    for host in feed_hosts(r, sc) {
        let mine: Vec<(&Run, &FeedReceiver)> = tools
            .iter()
            .filter_map(|t| {
                runs.iter().filter(|x| &x.tool == t).find_map(|x| {
                    let f = x.feed.as_ref()?;
                    let v = f.receivers.iter().find(|v| v.host == host.host)?;
                    Some((*x, v))
                })
            })
            .collect();
        s.push_str(&latency_chart(sc, tools, host, &mine));
        s.push_str(&distribution_chart(sc, tools, host, &mine));
    }
    s
}

/// Whether values spread more than 30x: a log axis shows them better.
fn spread_30x(vs: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = vs
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    (lo.is_finite() && hi / lo > 30.0).then_some((lo, hi))
}

/// One receiver's latency over time: per second of ready time, each tool's
/// median (solid) and largest (dashed, the same colour) latency.
fn latency_chart(
    sc: &str,
    tools: &[String],
    host: &FeedReceiver,
    mine: &[(&Run, &FeedReceiver)],
) -> String {
    let title = receiver_title(host);
    let mut lines = Vec::new();
    for (x, v) in mine.iter().filter(|(_, v)| !v.latency_by_second.is_empty()) {
        let c = color(tools, &x.tool);
        let points = |f: fn(&(f64, f64, f64)) -> (f64, f64)| {
            v.latency_by_second.iter().map(f).collect::<Vec<_>>()
        };
        lines.push(Line {
            label: format!("{}: median", x.tool),
            color: c,
            dash: "",
            points: points(|p| (p.0, p.1)),
            markers: false,
            hollow: false,
        });
        lines.push(Line {
            label: format!("{}: largest", x.tool),
            color: c,
            dash: "5 4",
            points: points(|p| (p.0, p.2)),
            markers: false,
            hollow: false,
        });
    }
    if lines.is_empty() {
        return format!(
            "<p class=meta>Latency over time at {}: no tool delivered it a due product.</p>",
            esc(&title)
        );
    }
    let end = mine
        .iter()
        .filter_map(|(x, _)| x.feed.as_ref().map(|f| f.seconds))
        .chain(lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)))
        .fold(0.0, f64::max);
    let y_log = spread_30x(lines.iter().flat_map(|l| l.points.iter().map(|p| p.1))).is_some();
    line_chart(&LineChart {
        kind: "latency",
        scenario: sc,
        caption: esc(&format!(
            "Latency over time at {title}: seconds from ready at the sender to verified here, per second of ready time, the median (solid) and the largest (dashed){}; each tool's first run",
            if y_log { ", on a log scale" } else { "" }
        )),
        x_title: "seconds since the producer's start (ready time)".into(),
        x: XAxis::Time { end },
        y_log,
        lines,
    })
}

/// One receiver's latency distribution: per tool, the share of the due
/// products it had (%) against their latency (a log axis where the
/// latencies spread more than 30x).
fn distribution_chart(
    sc: &str,
    tools: &[String],
    host: &FeedReceiver,
    mine: &[(&Run, &FeedReceiver)],
) -> String {
    let title = receiver_title(host);
    let lines: Vec<Line> = mine
        .iter()
        .filter(|(_, v)| !v.percentiles.is_empty())
        .map(|(x, v)| Line {
            label: x.tool.clone(),
            color: color(tools, &x.tool),
            dash: "",
            points: v
                .percentiles
                .iter()
                .enumerate()
                .map(|(k, l)| (*l, k as f64))
                .collect(),
            markers: false,
            hollow: false,
        })
        .collect();
    if lines.is_empty() {
        return format!(
            "<p class=meta>Latency distribution at {}: no tool delivered it a due product.</p>",
            esc(&title)
        );
    }
    let xs = || lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (x, log) = match spread_30x(xs()) {
        Some((lo, hi)) => (XAxis::Values { lo, hi, log: true }, true),
        None => {
            let hi = xs().filter(|v| v.is_finite()).fold(0.0, f64::max);
            let hi = if hi > 0.0 { hi } else { 1.0 };
            (
                XAxis::Values {
                    lo: 0.0,
                    hi,
                    log: false,
                },
                false,
            )
        }
    };
    line_chart(&LineChart {
        kind: "distribution",
        scenario: sc,
        caption: esc(&format!(
            "Latency distribution at {title}: % of the due products it had with at most that latency{}; each tool's first run",
            if log { " (latency on a log scale)" } else { "" }
        )),
        x_title: "latency, seconds".into(),
        x,
        y_log: false,
        lines,
    })
}

/// The study's figures beside this lab's: per figure, the replaying tool's
/// and longhaul's measure and their ratio to it.
fn study_table(r: &Results, scenarios: &[String], tools: &[String]) -> String {
    let rows: Vec<&Published> = r
        .suite
        .published
        .iter()
        .filter(|p| scenarios.contains(&p.scenario))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    // A measured value, and whether a run of it stopped at its time cap
    // (then a time is a lower bound, and so is its ratio to the study's).
    let value = |sc: &str, tool: &str, m: Metric| {
        let (v, note) = cell_of(&runs_of(r, sc, tool), m);
        v.map(|v| (v, note.contains('\u{23f1}')))
    };
    let cells = |t: Option<(String, Option<(f64, bool)>)>, p: &Published| match t {
        Some((t, Some((v, capped)))) => {
            let bound = if capped && p.metric == Metric::Seconds {
                "≥ "
            } else {
                ""
            };
            format!(
                "<td class=l>{}</td><td>{bound}{}{}</td><td>{bound}{:.2}</td>",
                esc(&t),
                esc(&metric_text(p.metric, v)),
                if capped { " †" } else { "" },
                v / p.value
            )
        }
        Some((t, None)) => format!("<td class=l>{}</td><td>-</td><td>-</td>", esc(&t)),
        None => "<td class=l>-</td><td>-</td><td>-</td>".to_string(),
    };
    let multicasts = |label: &str| {
        crate::tools::Tool::all()
            .into_iter()
            .find(|t| label.split(':').next() == Some(t.name()))
            .is_some_and(|t| t.multicasts())
    };
    let mut s = String::from(
        "<h2 id=\"study\">The study's figures beside this lab's</h2><p class=meta>Numbers the study itself prints (its tables, or values stated in its text), for the scenario that replays its setting. Ratio = this lab ÷ the study: for seconds below 1 is faster than the study's; for Mbit/s, TTP and G above 1 is better. †: a run stopped at its time cap (a time is then at least the cap). A scaled profile moves less data than the study did, which shortens times.</p><div class=scroll><table><tr><th class=l>scenario</th><th class=l>the study's series</th><th>study</th><th class=l>source</th><th class=l>replayed by</th><th>lab</th><th>ratio</th><th class=l>longhaul</th><th>lab</th><th>ratio</th></tr>",
    );
    for p in rows {
        let rep = p
            .tool
            .as_ref()
            .filter(|t| tools.contains(t))
            .map(|t| (t.clone(), value(&p.scenario, t, p.metric)));
        // longhaul's own variant of what the study measured: multicast
        // beside a multicast tool.
        let want_mc = p.tool.as_deref().is_some_and(multicasts);
        let lh = tools
            .iter()
            .filter(|t| t.starts_with("longhaul"))
            .filter_map(|t| value(&p.scenario, t, p.metric).map(|v| (t.clone(), Some(v))))
            .min_by_key(|(t, _)| multicasts(t) != want_mc);
        let _ = write!(
            s,
            "<tr><td class=l><a href=\"#{0}\">{0}</a></td><td class=l>{1}</td><td>{2}</td><td class=l>{3}</td>{4}{5}</tr>",
            esc(&p.scenario),
            esc(&p.series),
            esc(&metric_text(p.metric, p.value)),
            esc(&p.source),
            cells(rep, p),
            cells(lh, p),
        );
    }
    s.push_str("</table></div>");
    s
}

const STYLE: &str = r#"
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:980px;margin:2em auto;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#555} code{background:#f3f3f3;padding:0 .3em;border-radius:3px;overflow-wrap:anywhere}
.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em} th,td{border-bottom:1px solid #e4e4e4;padding:.3em .6em;text-align:right}
th:first-child,td:first-child,td.l,th.l,td.link{text-align:left} th{background:#fafafa} td{white-space:nowrap} td.l{white-space:normal}
.ok{color:#1a7f37} .bad{color:#b42318}
figure.chart{margin:1em 0 1.4em;max-width:680px}
figure.chart figcaption{font-size:13px;color:#444;margin-bottom:.3em}
figure.chart svg{display:block;max-width:100%;height:auto}
.chart svg text{font:11px system-ui,sans-serif;fill:#666}
.chart .xtitle{font-size:12px;color:#666;text-align:right}
.chart .legend{list-style:none;margin:.3em 0 0;padding:0;display:flex;flex-wrap:wrap;gap:.2em 1.2em;font-size:13px}
.chart .legend li{display:flex;align-items:center;gap:.4em;min-width:0}
.chart .legend .name{overflow-wrap:anywhere}
.chart .legend svg{flex:none}
.bars .grid{display:grid;grid-template-columns:minmax(3em,max-content) minmax(9em,1fr) minmax(4em,max-content);gap:5px 10px;align-items:center;font-size:13px}
.bars .name{text-align:right;overflow-wrap:anywhere;max-width:16em}
.bars .name.study{font-style:italic;color:#555}
.bars .track{position:relative;height:18px;background:#f4f4f4}
.bars .bar{position:absolute;left:0;top:0;bottom:0;background:var(--c)}
.bars .track.study .bar{background:repeating-linear-gradient(135deg,var(--c) 0 4px,#fff 4px 7px);outline:1px solid var(--c)}
.bars .target{position:absolute;top:-3px;bottom:-3px;border-left:2px dashed #000}
.bars .track.axis{height:15px;background:none}
.bars .tk{position:absolute;top:0;transform:translateX(-50%);font-size:11px;color:#666;white-space:nowrap;line-height:15px}
.bars .val{font-weight:600;overflow-wrap:anywhere;max-width:16em}
.bars .val.missing{color:#b42318;font-weight:normal}
"#;

/// The overview table: a row per scenario, a column per tool, the suite's
/// measure in each cell.
fn overview(s: &mut String, r: &Results, scenarios: &[&String], tools: &[&String]) {
    let info = &r.suite.suite;
    let m = measure(r);
    let _ = write!(
        s,
        "<h2>Overview: {}</h2><div class=scroll><table><tr><th>scenario</th>",
        match m {
            Metric::Seconds => "seconds to move the data set (shorter is better)",
            _ => "Mbit/s",
        }
    );
    for t in tools {
        let _ = write!(s, "<th>{}</th>", esc(t));
    }
    s.push_str("</tr>");
    for sc in scenarios {
        let _ = write!(s, "<tr><td><a href=\"#{0}\">{0}</a></td>", esc(sc));
        let best = tools
            .iter()
            .filter_map(|t| cell_of(&runs_of(r, sc, t), m).0)
            .reduce(|a, b| {
                if m == Metric::Seconds {
                    a.min(b)
                } else {
                    a.max(b)
                }
            });
        for t in tools {
            let runs = runs_of(r, sc, t);
            if runs.is_empty() {
                s.push_str("<td></td>");
                continue;
            }
            match cell_of(&runs, m) {
                (Some(v), note) => {
                    let class = match (m, info.target_mbps) {
                        (Metric::Mbps, Some(tg)) if v >= tg => "ok",
                        (Metric::Mbps, Some(_)) => "bad",
                        (Metric::Seconds, _) if Some(v) == best => "ok",
                        _ => "",
                    };
                    let text = match m {
                        Metric::Seconds => secs_text(v),
                        _ => rate_text(v),
                    };
                    let _ = write!(s, "<td class=\"{class}\">{text}{}</td>", esc(&note));
                }
                (None, why) => {
                    let _ = write!(s, "<td class=bad>{}</td>", esc(&why));
                }
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</table></div>");
    if m == Metric::Seconds {
        s.push_str("<p class=meta>Green: the fastest in its row; red: no measured run. †: stopped at the time cap (its time is the cap).</p>");
    } else if info.target_mbps.is_some() {
        s.push_str(
            "<p class=meta>Green: at or above the target; red: below it, or no verified run. †: stopped at the time cap; the rate of what it had delivered by then.</p>",
        );
    }
}

/// The whole page.
pub(crate) fn render(r: &Results) -> String {
    CHART_ID.with(|c| c.set(0));
    let info = &r.suite.suite;
    let (scenarios, tools) = axes(r);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>longhaul lab: {name}</title><style>{STYLE}</style></head><body>
<h1>{name}</h1><p>{desc}</p>"#,
        name = esc(&info.name),
        desc = esc(&info.description)
    );
    if !info.cites.is_empty() {
        let _ = write!(s, "<p class=meta>Replays: {}</p>", esc(&info.cites));
    }
    let _ = write!(
        s,
        "<p class=meta>Line rate {} bit/s{}{}. Machine: {} cores ({}), kernel {}; the sender, the receiver and the emulator share those cores.</p>",
        esc(&info.line_rate),
        info.target_mbps
            .map_or(String::new(), |t| format!("; target {t} Mbit/s")),
        info.cc
            .as_ref()
            .map_or(String::new(), |c| format!("; TCP tools use {}", esc(c))),
        esc(r.machine.get("cores").map_or("?", |x| x)),
        esc(r.machine.get("cpu").map_or("?", |x| x)),
        esc(r.machine.get("kernel").map_or("?", |x| x)),
    );
    if !r.profile_note.is_empty() {
        let _ = write!(s, "<p class=meta>Scaled: {}.</p>", esc(&r.profile_note));
    }
    // Dissemination scenarios have no throughput to compare: the overview
    // and the bars leave them out; their sections say what they measured.
    let (feeds, plain): (Vec<&String>, Vec<&String>) =
        scenarios.iter().partition(|sc| is_feed(r, sc));
    let plain_tools: Vec<&String> = tools
        .iter()
        .filter(|t| plain.iter().any(|sc| !runs_of(r, sc, t).is_empty()))
        .collect();
    if !plain.is_empty() {
        overview(&mut s, r, &plain, &plain_tools);
    } else {
        s.push_str("<h2>Overview</h2>");
    }
    if !feeds.is_empty() {
        let links: Vec<String> = feeds
            .iter()
            .map(|sc| format!("<a href=\"#{0}\">{0}</a>", esc(sc)))
            .collect();
        let _ = write!(
            s,
            "<p class=meta>Dissemination scenarios (products delivered as they are made, to receivers that may join late or restart; what each receiver had, and how late, rather than a rate): {}.</p>",
            links.join(", ")
        );
    }
    s.push_str(&study_table(r, &scenarios, &tools));
    for (name, sw) in &r.suite.sweep {
        let charts: String = sw
            .metrics
            .iter()
            .map(|m| sweep_chart(r, name, sw, *m, &tools))
            .collect();
        if !charts.is_empty() {
            let _ = write!(
                s,
                "<h2>{}</h2>{charts}",
                esc(if sw.title.is_empty() { name } else { &sw.title })
            );
        }
    }
    for sc in &scenarios {
        let first = r.runs.iter().find(|x| &x.scenario == sc).expect("a run");
        let _ = write!(
            s,
            "<h2 id=\"{0}\">{0}</h2><p class=meta>{3} <code>{1}</code>{5}; {2}{4}.</p>",
            esc(sc),
            esc(&first.link),
            if first.data.is_empty() {
                format!("{} files, {:.1} MB", first.files, first.bytes as f64 / 1e6)
            } else {
                esc(&first.data)
            },
            if first.receivers > 1 {
                "Links (one per receiver)"
            } else {
                "Link"
            },
            if first.receivers > 1 {
                format!(" to each of {} receivers", first.receivers)
            } else {
                String::new()
            },
            mtu_note(first.mtu)
        );
        if feeds.contains(&sc) {
            // What the links carried, where the runs recorded it, then
            // what each receiver had, and when.
            s.push_str(&series(r, sc, &tools, first));
            s.push_str(&feed_section(r, sc, &tools));
            continue;
        }
        s.push_str(&scenario_bars(r, sc, &tools, first));
        s.push_str(&series(r, sc, &tools, first));
        s.push_str(&receivers_done(r, sc));
        s.push_str("<div class=scroll><table><tr><th class=l>tool</th><th>run</th><th class=l>status</th><th>s</th><th>first byte s</th><th>to 90 % s</th><th>Mbit/s</th><th>TTP</th><th>G</th><th>share</th><th>Jain</th><th>bg kept</th><th>client CPU s</th><th>server CPU s</th><th>emulator CPU s</th><th>machine CPU s</th><th class=l>limit</th><th class=l>note</th></tr>");
        for x in r.runs.iter().filter(|x| &x.scenario == sc) {
            let class = if x.status == Status::Ok { "ok" } else { "bad" };
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td class=\"l {class}\">{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td class=l>{}</td><td class=l>{}</td></tr>",
                esc(&x.tool),
                x.rep,
                esc(x.status.as_str()),
                x.wall_s,
                x.ttfb_s.map_or("-".into(), |t| format!("{t:.2}")),
                x.to_90pct_s.map_or("-".into(), |t| format!("{t:.1}")),
                rate_text(x.mbps),
                x.ttp,
                x.goodput,
                share_text(x),
                jain_text(x),
                kept_text(x),
                x.client_cpu_s,
                x.server_cpu_s,
                x.emulator_cpu_s,
                x.machine_cpu_s,
                esc(&x.limit),
                esc(&x.note)
            );
        }
        s.push_str("</table></div>");
    }
    s.push_str("<h2>Tools</h2><ul>");
    for (t, v) in &r.versions {
        let _ = write!(s, "<li>{}: {}</li>", esc(t), esc(v));
    }
    s.push_str("</ul><p class=meta>Mbit/s = payload bytes × 8 / wall time per receiver (below 1 Mbit/s shown in kbit/s), from the clients' start until the last one exits, with every receiver's tree verified by hash afterwards (a run stopped at its time cap counts the bytes it had delivered). TTP = (payload bytes / the scenario's link rate, its receivers' down direction, the slowest if several; the suite's line rate only where the link sets none) / wall time; G = payload bytes delivered / bytes the server sent on the wire (both as in seed 003; with several receivers G counts one copy, so multicast stays near 1 and unicast to two falls near 0.5). First byte: seconds until a file at a receiver had its first byte on disk (longhaul writes a chunk of up to 1 MiB once all of it is in and hashed: on a slow link that comes long after its first data; its `--json` says when that came, `first_data_s`). To 90 %: seconds from the first data (the first 100 ms that carried 1 Mbit/s, or a tenth of a slower link) to the end of the first 100 ms that carried 90 % of the link (one receiver, no background traffic; divide by the RTT for round trips to line rate). The time series is what the emulator delivered per receiver per 100 ms (beside background traffic: less the background flows' own bytes per 100 ms, or where the emulator kept no series for them, counted once a second and spread evenly; the background's own series is drawn dotted in the tool's colour), averaged over longer windows on slow links. Share: the tool's Mbit/s over the tool's and the background's together (fair beside N TCP flows: 1/(N+1)). Jain: Jain's fairness index over the tool's rate and each background TCP flow's, IP bytes the emulator delivered over the run (1 when all got the same, 1/(N+1) when one took everything). Bg kept: the background's rate in the tool's first 10 round trips over its rate in the span before the tool started (10 round trips, at least 1 s): 1.0 = a start that took nothing from a full link at first. CPU: user + system seconds of what the tool ran in the receivers (client) and in the server, children included");
    s.push_str(CPU_NOTE);
    s.push_str("</p></body></html>\n");
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::FeedRun;

    /// A run as results.json would hold it: `mbps` over 10 s, verified.
    fn plain_run(sc: &str, tool: &str, status: &str, mbps: f64) -> Run {
        serde_json::from_value(serde_json::json!({
            "scenario": sc, "tool": tool, "rep": 1, "link": "delay=35ms",
            "status": status, "note": if status == "skipped" { "not installed" } else { "" },
            "files": 2, "bytes": 1_000_000, "wall_s": 10.0, "mbps": mbps, "ttp": 0.5,
            "goodput": 0.97, "wire_bytes": 1_030_000, "client_cpu_s": 0.1,
            "server_cpu_s": 0.2, "verified": status == "ok",
            "series_mbps": if status == "skipped" { vec![] } else { vec![mbps; 10] }
        }))
        .unwrap()
    }

    /// A receiver of a 60 s feed: latencies from `lo` to `hi` s (its
    /// percentiles rise as a cube), from second `from` of the producer's.
    #[allow(clippy::too_many_arguments)]
    fn receiver(
        host: &str,
        link: &str,
        role: &str,
        (had, due): (u64, u64),
        (p50, p99): (f64, f64),
        (lo, hi): (f64, f64),
        from: u32,
        cpu_s: f64,
    ) -> FeedReceiver {
        FeedReceiver {
            host: host.into(),
            link: link.into(),
            role: role.into(),
            due,
            had,
            extra: if from > 0 { 3 } else { 0 },
            duplicates: due - had + if from > 0 { 3 } else { 0 },
            corrupt: 0,
            p50_s: Some(p50),
            p99_s: Some(p99),
            max_s: Some(hi),
            latency_by_second: (from..60)
                .map(|t| {
                    let top = if t == from + 5 { hi } else { p99 };
                    (f64::from(t), p50 + 0.01 * f64::from(t % 5), top)
                })
                .collect(),
            percentiles: (0..=100)
                .map(|k| lo + (hi - lo) * (f64::from(k) / 100.0).powi(3))
                .collect(),
            cpu_s,
            rss_kb: vec![(0.0, 20_000), (30.0, 45_000), (60.0, 30_000)],
        }
    }

    /// A suite run with a throughput scenario `a` (rsync) and a
    /// dissemination scenario `feed`: longhaul-mc and uftp to two receivers
    /// (the second joins late), and longhaul skipped.
    pub(crate) fn feed_results() -> Results {
        let link1 = "rate=20M delay=30ms";
        let link2 = "rate=20M delay=30ms loss=1e-2";
        let late = "joined at 12 s & restarted";
        let feed = |tool: &str, status: &str, receivers: Vec<FeedReceiver>| {
            let mut x = plain_run("feed", tool, status, 123.37);
            x.link = format!("{link1} | {link2}");
            x.receivers = 2;
            x.files = 9253;
            x.bytes = 925_300_000;
            x.wall_s = 65.0;
            x.ttp = 0.0;
            x.goodput = 0.0;
            x.series_mbps.clear();
            x.client_cpu_s = receivers.iter().map(|v| v.cpu_s).sum();
            x.server_cpu_s = 3.2;
            x.emulator_cpu_s = 0.7;
            x.machine_cpu_s = 9.0;
            if status == "timeout" {
                x.note = "cli2 had 7398 of 7400 due products".into();
            }
            x.feed = Some(FeedRun {
                produced: 9253,
                produced_bytes: 925_300_000,
                seconds: 60.0,
                load_mbps: 123.37,
                sender_cpu_s: 3.2,
                sender_rss_kb: vec![(0.0, 10_000), (20.0, 50_000), (60.0, 40_000)],
                receivers,
                busy_cores: vec![(5.0, 0.5), (10.0, 1.25)],
                runner_cpu_s: 1.5,
            });
            x
        };
        let mc = feed(
            "longhaul-mc",
            "ok",
            vec![
                receiver(
                    "cli",
                    link1,
                    "",
                    (9253, 9253),
                    (0.12, 0.45),
                    (0.05, 0.8),
                    0,
                    1.5,
                ),
                receiver(
                    "cli2",
                    link2,
                    late,
                    (7400, 7400),
                    (0.2, 0.9),
                    (0.1, 1.4),
                    12,
                    1.5,
                ),
            ],
        );
        let uftp = feed(
            "uftp",
            "timeout",
            vec![
                receiver(
                    "cli",
                    link1,
                    "",
                    (9253, 9253),
                    (0.5, 0.95),
                    (0.1, 1.0),
                    0,
                    2.0,
                ),
                receiver(
                    "cli2",
                    link2,
                    late,
                    (7398, 7400),
                    (0.6, 12.5),
                    (0.2, 20.0),
                    12,
                    2.5,
                ),
            ],
        );
        let mut skipped = plain_run("feed", "longhaul", "skipped", 0.0);
        skipped.link = mc.link.clone();
        Results {
            suite: crate::scenario::Suite::load("demo").unwrap(),
            profile: "quick".into(),
            profile_note: String::new(),
            started_unix: 0,
            machine: Default::default(),
            versions: Default::default(),
            line_rate_bps: 1_000_000_000,
            command: String::new(),
            runs: vec![plain_run("a", "rsync", "ok", 14.0), mc, uftp, skipped],
        }
    }

    /// The figures of one kind drawn for scenario `sc`, each up to its end.
    fn figures<'a>(page: &'a str, kind: &str, sc: &str) -> Vec<&'a str> {
        page.split(&format!(
            "<figure class=\"chart {kind}\" data-scenario=\"{sc}\">"
        ))
        .skip(1)
        .map(|f| f.split("</figure>").next().unwrap())
        .collect()
    }

    #[test]
    fn a_dissemination_scenario_draws_each_receivers_latency_and_no_throughput() {
        let r = feed_results();
        let page = render(&r);
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
        // No rate to compare: no bars and no overview row for it, a link.
        assert!(figures(&page, "bars", "feed").is_empty());
        assert_eq!(figures(&page, "bars", "a").len(), 1);
        assert!(!page.contains("<td><a href=\"#feed\">"), "an overview row");
        assert!(page.contains("<td><a href=\"#a\">a</a></td>"));
        assert!(page.contains(": <a href=\"#feed\">feed</a>.</p>"));
        assert!(
            !page.contains("<th>longhaul-mc</th>"),
            "a throughput column"
        );
        // Latency over time: one chart per receiver, titled with its host,
        // link and role (escaped), a solid median and a dashed largest line
        // per tool, in the tool's colour, on time from 0 to the 60 s.
        let over = figures(&page, "latency", "feed");
        assert_eq!(over.len(), 2, "a latency chart per receiver");
        assert!(over[0]
            .starts_with("<figcaption>Latency over time at cli (link rate=20M delay=30ms): "));
        assert!(
            over[1].starts_with("<figcaption>Latency over time at cli2 (link rate=20M delay=30ms loss=1e-2; joined at 12 s &amp; restarted): "),
            "{}",
            &over[1][..200]
        );
        assert!(!page.contains("12 s & restarted"), "unescaped");
        let (mc, uftp) = (
            color(&axes(&r).1, "longhaul-mc"),
            color(&axes(&r).1, "uftp"),
        );
        assert_ne!(mc, uftp);
        for f in &over {
            assert_eq!(f.matches("<polyline").count(), 4, "{f}");
            assert_eq!(f.matches("stroke-dasharray=\"5 4\"><title>").count(), 2);
            for (tool, c) in [("longhaul-mc", mc), ("uftp", uftp)] {
                assert!(f.contains(&format!(
                    "stroke=\"{c}\" stroke-width=\"1.8\"><title>{tool}: median</title>"
                )));
                assert!(f.contains(&format!(
                    "stroke=\"{c}\" stroke-width=\"1.8\" stroke-dasharray=\"5 4\"><title>{tool}: largest</title>"
                )));
                assert!(f.contains(&format!("<span class=\"name\">{tool}: largest</span>")));
            }
            assert!(
                f.contains("text-anchor=\"middle\">60</text>")
                    && !f.contains("text-anchor=\"middle\">70</text>"),
                "{f}"
            );
        }
        // cli2's uftp latencies run from 0.6 to 20 s: a log axis.
        assert!(!over[0].contains("log scale") && over[1].contains("(dashed), on a log scale;"));
        // Its points start at the second it joined.
        let cli2_mc = over[1].split("<polyline points=\"").nth(1).unwrap();
        let first_x: f64 = cli2_mc.split(',').next().unwrap().parse().unwrap();
        let plot_left: f64 = over[1]
            .split("class=\"plot-area\" x=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(first_x > plot_left + 80.0, "{first_x} vs {plot_left}");
        // The distribution: a line per tool, 0 to 100 %, 101 points; a log
        // latency axis where they spread more than 30x (cli2: 0.1 to 20 s).
        let dist = figures(&page, "distribution", "feed");
        assert_eq!(dist.len(), 2, "a distribution chart per receiver");
        assert!(dist[0]
            .starts_with("<figcaption>Latency distribution at cli (link rate=20M delay=30ms): "));
        assert!(dist[1].starts_with("<figcaption>Latency distribution at cli2 (link rate=20M delay=30ms loss=1e-2; joined at 12 s &amp; restarted): "));
        assert!(!dist[0].contains("log scale") && dist[1].contains("(latency on a log scale)"));
        for f in &dist {
            assert_eq!(f.matches("<polyline").count(), 2);
            assert!(!f.contains("stroke-dasharray"));
            assert!(
                f.contains("text-anchor=\"end\">100</text>")
                    && !f.contains("text-anchor=\"end\">120</text>"),
                "{f}"
            );
            let pts = f.split("<polyline points=\"").nth(1).unwrap();
            assert_eq!(
                pts.split('"').next().unwrap().split_whitespace().count(),
                101
            );
        }
        assert!(
            dist[1].contains("text-anchor=\"middle\">0.1</text>")
                && dist[1].contains("text-anchor=\"middle\">10</text>"),
            "{}",
            dist[1]
        );
        // The tables: the sender's numbers per run, each receiver's had/due
        // and latencies.
        assert!(page.contains("<td>9253</td><td>925.3</td><td>60</td><td>123.4</td><td>65.00</td><td>3.20</td><td>10.2→51.2→41.0</td><td>3.00</td><td>0.70</td><td>1.50</td><td>9.00</td><td>1.25</td>"), "sender row");
        assert!(page.contains("<td class=\"ok\">9253/9253</td><td>0</td><td>0</td><td>0</td><td>0.12</td><td>0.45</td><td>0.80</td><td>1.50</td><td>20.5→30.7</td>"));
        assert!(page.contains("<td class=l>joined at 12 s &amp; restarted</td><td class=\"bad\">7398/7400</td><td>3</td><td>5</td><td>0</td><td>0.60</td><td>12.50</td><td>20.00</td>"));
        assert!(
            page.contains("<td>longhaul</td><td>1</td><td class=\"l bad\">skipped</td><td>-</td>")
        );
        // The generic per-run table (TTP, G, ...) is not drawn for it.
        let section = page.split("<h2 id=\"feed\">").nth(1).unwrap();
        assert!(!section.contains("<th>TTP</th>"));
    }

    #[test]
    fn axes_are_round_and_fit_the_data() {
        assert_eq!(nice_step(10.0, 5), 2.0);
        assert_eq!(nice_step(7.0, 4), 2.0);
        assert_eq!(nice_step(0.03, 3), 0.01);
        assert_eq!(value_ticks(217.6, 4).0, 300.0);
        assert_eq!(
            value_ticks(217.6, 5),
            (250.0, vec![0.0, 50.0, 100.0, 150.0, 200.0, 250.0])
        );
        assert_eq!(value_ticks(1000.0, 4).0, 1000.0);
        // A 5.3 s run ends its axis at 5.3 s, not 10 or 100.
        assert_eq!(time_ticks(5.3, 6), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let (a, b, t) = log_ticks(14.0, 900.0);
        assert_eq!((a, b), (10.0, 1000.0));
        assert_eq!(t, vec![10.0, 30.0, 100.0, 300.0, 1000.0]);
        let (_, _, t) = log_ticks(14.0, 90.0);
        assert_eq!(t, vec![10.0, 20.0, 50.0, 100.0]);
        let (a, b, t) = log_ticks(0.002, 3000.0);
        assert_eq!((a, b), (0.001, 10000.0));
        assert_eq!(t, vec![0.001, 0.1, 10.0, 1000.0, 10000.0]);
        assert_eq!(tick_text(0.2, 0.2), "0.2");
        assert_eq!(tick_text(150.0, 50.0), "150");
    }

    #[test]
    fn rate_axes_take_the_unit_that_fits_their_size() {
        assert_eq!(rate_unit(0.25).name, "kbit/s");
        assert_eq!(rate_unit(12.0).name, "Mbit/s");
    }

    #[test]
    fn receivers_are_told_apart_by_what_their_links_do_not_share() {
        assert_eq!(
            receiver_labels("rate=1G loss=1e-3 | rate=1G loss=1e-2", 2),
            vec!["receiver 1 (loss=1e-3)", "receiver 2 (loss=1e-2)"]
        );
        assert_eq!(
            receiver_labels("rate=1G | rate=1G", 2),
            vec!["receiver 1", "receiver 2"]
        );
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
