//! report.html: one self-contained page (inline CSS and SVG, no scripts, no
//! external files) rendered from results.json. Per scenario: a bar per tool
//! (mean Mbit/s of its verified runs, the suite's target as a line), the
//! emulator's throughput over time for each tool's first run (like the
//! studies' histograms), and every run's numbers.

use crate::results::{axes, cell, cell_of, rate_text, runs_of, share_text, Results, Run, Status};
use crate::scenario::{down_rate_bps, Metric, Sweep};
use std::fmt::Write as _;

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// Escapes text for HTML and SVG.
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

/// A "nice" axis maximum at or above `v` (1, 2 or 5 × a power of ten).
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&m| m >= v)
        .unwrap_or(10.0 * p)
}

/// Horizontal bars: one per tool, its mean Mbit/s or why it has none.
fn bars(r: &Results, scenario: &str, tools: &[String]) -> String {
    let rows: Vec<(String, Option<f64>, String)> = tools
        .iter()
        .filter_map(|t| {
            let runs = runs_of(r, scenario, t);
            (!runs.is_empty()).then(|| {
                let (m, note) = cell(&runs);
                (t.clone(), m, note)
            })
        })
        .collect();
    // This scenario's link rate (the suite's only where its links have none).
    let link = r.runs.iter().find(|x| x.scenario == scenario);
    let line = link
        .and_then(|x| down_rate_bps(x.link.split(" | ")))
        .unwrap_or(r.line_rate_bps) as f64
        / 1e6;
    let target = r.suite.suite.target_mbps;
    let top = rows.iter().filter_map(|x| x.1).fold(0.0, f64::max);
    let low = rows
        .iter()
        .filter_map(|x| x.1)
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // The fastest bar or the target, but at least a tenth of the link's rate,
    // so that a few Mbit/s do not fill the chart.
    let (left, width, bar_h, gap) = (90.0, 460.0, 22.0, 8.0);
    let height = 30.0 + rows.len() as f64 * (bar_h + gap) + 24.0;
    let hi = top.max(target.unwrap_or(0.0)).max(line / 10.0);
    // Values that differ by more than 50× (as in seed 000's histograms) get
    // a log axis, so that the slow tools' bars do not vanish.
    let log = low.is_finite() && hi / low > 50.0;
    let (xmin, xmax) = if log {
        (
            10f64.powf(low.log10().floor()).max(0.001),
            10f64.powf(hi.log10().ceil()),
        )
    } else {
        (0.0, nice_max(hi))
    };
    let x = |v: f64| {
        if log {
            left + (v.max(xmin) / xmin).log10() / (xmax / xmin).log10() * width
        } else {
            left + v / xmax * width
        }
    };
    let mut s = format!(
        r#"<svg class="chart" viewBox="0 0 640 {height}" width="640" height="{height}" role="img" aria-label="Mbit/s per tool">"#
    );
    // Grid and axis labels.
    let ticks: Vec<f64> = if log {
        let decades = (xmax / xmin).log10().round() as i32;
        (0..=decades).map(|k| xmin * 10f64.powi(k)).collect()
    } else {
        (0..=5).map(|k| xmax * k as f64 / 5.0).collect()
    };
    for v in ticks {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" y1="20" x2="{0:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{0:.1}" y="{2:.1}" class="tick" text-anchor="middle">{3}</text>"##,
            x(v),
            height - 24.0,
            height - 8.0,
            fmt_num(v)
        );
    }
    for (i, (tool, mean, note)) in rows.iter().enumerate() {
        let y = 24.0 + i as f64 * (bar_h + gap);
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" class="label" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + bar_h * 0.7,
            esc(tool)
        );
        match mean {
            Some(m) => {
                let value = rate_text(*m);
                let unit = if value.ends_with("kbit/s") {
                    ""
                } else {
                    " Mbit/s"
                };
                let _ = write!(
                    s,
                    r#"<rect x="{left}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{}"><title>{} {value}{unit}{}</title></rect><text x="{:.1}" y="{:.1}" class="value">{value}{}</text>"#,
                    (x(*m) - left).max(1.0),
                    color(tools, tool),
                    esc(tool),
                    esc(note),
                    x(*m) + 4.0,
                    y + bar_h * 0.7,
                    esc(note)
                );
            }
            None => {
                let _ = write!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" class="missing">{}</text>"#,
                    left + 4.0,
                    y + bar_h * 0.7,
                    esc(note)
                );
            }
        }
    }
    if let Some(t) = target {
        if t <= xmax && t >= xmin {
            let _ = write!(
                s,
                r##"<line x1="{0:.1}" y1="16" x2="{0:.1}" y2="{1:.1}" stroke="#000" stroke-dasharray="5,3"/><text x="{0:.1}" y="12" class="tick" text-anchor="middle">target {2}</text>"##,
                x(t),
                height - 24.0,
                fmt_num(t)
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" class="tick">Mbit/s{}</text></svg>"#,
        left + width + 16.0,
        height - 8.0,
        if log { " (log)" } else { "" }
    );
    s
}

/// Horizontal grid lines at fifths of `ymax`, with their values.
fn y_grid(s: &mut String, left: f64, w: f64, ymax: f64, py: impl Fn(f64) -> f64) {
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#ddd"/><text x="{2:.1}" y="{3:.1}" class="tick" text-anchor="end">{4}</text>"##,
            py(v),
            left + w,
            left - 6.0,
            py(v) + 4.0,
            fmt_num(v)
        );
    }
}

/// One legend entry: a colour swatch and a name.
fn legend(s: &mut String, x: f64, y: f64, color: &str, name: &str) {
    let _ = write!(
        s,
        r#"<rect x="{x:.1}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{:.1}" y="{y:.1}" class="label">{}</text>"#,
        y - 4.0,
        x + 18.0,
        esc(name)
    );
}

/// A sweep: Mbit/s against the scenarios' x, a line per tool (mean of its
/// measured runs; a point is left out where a tool has none).
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
    let lines: Vec<(&String, Vec<(f64, f64)>)> = tools
        .iter()
        .map(|t| {
            let pts = xs
                .iter()
                .filter_map(|(sc, xv)| cell_of(&runs_of(r, sc, t), metric).0.map(|m| (*xv, m)))
                .collect();
            (t, pts)
        })
        .filter(|(_, pts): &(&String, Vec<(f64, f64)>)| !pts.is_empty())
        .collect();
    let (x0, x1) = (xs[0].1, xs[xs.len() - 1].1);
    let log = sw.log_x && x0 > 0.0;
    let peak = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(0.0, f64::max);
    let ymax = nice_max(match metric {
        Metric::Mbps => peak.max(r.suite.suite.target_mbps.unwrap_or(0.0)),
        _ => peak,
    });
    let (left, top, w, h) = (60.0, 14.0, 540.0, 220.0);
    let px = |v: f64| {
        let f = if x1 <= x0 {
            0.5
        } else if log {
            (v / x0).log10() / (x1 / x0).log10()
        } else {
            (v - x0) / (x1 - x0)
        };
        left + f * w
    };
    let py = |v: f64| top + h - v / ymax * h;
    let rows = lines.len().div_ceil(4).max(1);
    let mut s = format!(
        r#"<svg class="chart" viewBox="0 0 640 {0}" width="640" height="{0}" role="img" aria-label="sweep {1}">"#,
        top + h + 44.0 + rows as f64 * 16.0,
        esc(name)
    );
    y_grid(&mut s, left, w, ymax, py);
    for (_, v) in &xs {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#f0f0f0"/><text x="{0:.1}" y="{2:.1}" class="tick" text-anchor="middle">{3}</text>"##,
            px(*v),
            top + h,
            top + h + 16.0,
            fmt_num(*v)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text><text x="12" y="{:.1}" class="tick" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
        left + w,
        top + h + 32.0,
        esc(&sw.x),
        top + h / 2.0,
        top + h / 2.0,
        metric.label()
    );
    for (i, (t, pts)) in lines.iter().enumerate() {
        let c = color(tools, t);
        let path: String = pts
            .iter()
            .map(|(xv, m)| format!("{:.1},{:.1} ", px(*xv), py(*m)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"><title>{}</title></polyline>"#,
            esc(t)
        );
        for (xv, m) in pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"><title>{} at {}: {} {}</title></circle>"#,
                px(*xv),
                py(*m),
                esc(t),
                fmt_num(*xv),
                fmt_num(*m),
                metric.label()
            );
        }
        legend(
            &mut s,
            left + (i % 4) as f64 * 140.0,
            top + h + 52.0 + (i / 4) as f64 * 16.0,
            c,
            t,
        );
    }
    s.push_str("</svg>");
    s
}

/// Throughput over time: the emulator's 100 ms series of each tool's first run.
fn series(r: &Results, scenario: &str, tools: &[String]) -> String {
    let runs: Vec<&Run> = tools
        .iter()
        .filter_map(|t| {
            r.runs
                .iter()
                .find(|x| x.scenario == scenario && &x.tool == t && !x.series_mbps.is_empty())
        })
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let secs = runs
        .iter()
        .map(|x| x.series_mbps.len() as f64 * 0.1)
        .fold(0.0, f64::max);
    let peak = runs
        .iter()
        .flat_map(|x| x.series_mbps.iter().copied())
        .fold(0.0, f64::max);
    let ymax = nice_max(peak);
    let xmax = nice_max(secs);
    let (left, top, w, h) = (60.0, 14.0, 540.0, 180.0);
    let px = |t: f64| left + t / xmax * w;
    let py = |v: f64| top + h - v / ymax * h;
    let mut s = format!(
        r#"<svg class="chart" viewBox="0 0 640 {0}" width="640" height="{0}" role="img" aria-label="throughput over time">"#,
        top + h + 60.0 + (runs.len().saturating_sub(1) / 5) as f64 * 16.0
    );
    y_grid(&mut s, left, w, ymax, py);
    for k in 0..=5 {
        let t = xmax * k as f64 / 5.0;
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"#,
            px(t),
            top + h + 16.0,
            fmt_num(t)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">seconds</text><text x="12" y="{:.1}" class="tick" transform="rotate(-90 12 {:.1})" text-anchor="middle">Mbit/s per 100 ms</text>"#,
        left + w,
        top + h + 30.0,
        top + h / 2.0,
        top + h / 2.0
    );
    for (i, x) in runs.iter().enumerate() {
        let pts: String = x
            .series_mbps
            .iter()
            .enumerate()
            .map(|(k, v)| format!("{:.1},{:.1} ", px((k as f64 + 0.5) * 0.1), py(*v)))
            .collect();
        let c = color(tools, &x.tool);
        let _ = write!(
            s,
            r#"<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.6"><title>{}</title></polyline>"#,
            esc(&x.tool)
        );
        // Legend: five to a row.
        legend(
            &mut s,
            left + (i % 5) as f64 * 110.0,
            top + h + 46.0 + (i / 5) as f64 * 16.0,
            c,
            &x.tool,
        );
    }
    s.push_str("</svg>");
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        // 0.5, 0.25, 0.01, 0.001: no trailing zeros.
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The whole page.
pub(crate) fn render(r: &Results) -> String {
    let info = &r.suite.suite;
    let (scenarios, tools) = axes(r);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>longhaul lab: {name}</title>
<style>
body{{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:980px;margin:2em auto;padding:0 1em}}
h1{{font-size:1.6em;margin-bottom:.2em}} h2{{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}}
.meta{{color:#555}} code{{background:#f3f3f3;padding:0 .3em;border-radius:3px}}
table{{border-collapse:collapse;margin:.8em 0;font-size:.92em}} th,td{{border-bottom:1px solid #e4e4e4;padding:.3em .6em;text-align:right}}
th:first-child,td:first-child,td.l,th.l{{text-align:left}} th{{background:#fafafa}}
.ok{{color:#1a7f37}} .bad{{color:#b42318}} .chart{{display:block;margin:.6em 0;max-width:100%;height:auto}}
.chart text{{font:12px system-ui,sans-serif;fill:#333}} .chart .value{{font-weight:600}} .chart .missing{{fill:#b42318}} .chart .tick{{fill:#666;font-size:11px}}
</style></head><body>
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
    // Overview table.
    s.push_str("<h2>Overview: Mbit/s</h2><table><tr><th>scenario</th>");
    for t in &tools {
        let _ = write!(s, "<th>{}</th>", esc(t));
    }
    s.push_str("</tr>");
    for sc in &scenarios {
        let _ = write!(s, "<tr><td><a href=\"#{0}\">{0}</a></td>", esc(sc));
        for t in &tools {
            let runs = runs_of(r, sc, t);
            if runs.is_empty() {
                s.push_str("<td></td>");
                continue;
            }
            match cell(&runs) {
                (Some(m), note) => {
                    let class = match info.target_mbps {
                        Some(tg) if m >= tg => "ok",
                        Some(_) => "bad",
                        None => "",
                    };
                    let _ = write!(
                        s,
                        "<td class=\"{class}\">{}{}</td>",
                        rate_text(m),
                        esc(&note)
                    );
                }
                (None, why) => {
                    let _ = write!(s, "<td class=bad>{}</td>", esc(&why));
                }
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    if info.target_mbps.is_some() {
        s.push_str(
            "<p class=meta>Green: at or above the target; red: below it, or no verified run. †: stopped at the time cap; the rate of what it had delivered by then.</p>",
        );
    }
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
            "<h2 id=\"{0}\">{0}</h2><p class=meta>{3} <code>{1}</code>; {2}{4}.</p>",
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
            }
        );
        s.push_str(&bars(r, sc, &tools));
        s.push_str(&series(r, sc, &tools));
        s.push_str("<table><tr><th class=l>tool</th><th>run</th><th class=l>status</th><th>s</th><th>first byte s</th><th>Mbit/s</th><th>TTP</th><th>G</th><th>share</th><th>client CPU s</th><th>server CPU s</th><th class=l>note</th></tr>");
        for x in r.runs.iter().filter(|x| &x.scenario == sc) {
            let class = if x.status == Status::Ok { "ok" } else { "bad" };
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td class=\"l {class}\">{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td class=l>{}</td></tr>",
                esc(&x.tool),
                x.rep,
                esc(x.status.as_str()),
                x.wall_s,
                x.ttfb_s.map_or("-".into(), |t| format!("{t:.2}")),
                rate_text(x.mbps),
                x.ttp,
                x.goodput,
                share_text(x),
                x.client_cpu_s,
                x.server_cpu_s,
                esc(&x.note)
            );
        }
        s.push_str("</table>");
    }
    s.push_str("<h2>Tools</h2><ul>");
    for (t, v) in &r.versions {
        let _ = write!(s, "<li>{}: {}</li>", esc(t), esc(v));
    }
    s.push_str("</ul><p class=meta>Mbit/s = payload bytes × 8 / wall time per receiver (below 1 Mbit/s shown in kbit/s), from the clients' start until the last one exits, with every receiver's tree verified by hash afterwards (a run stopped at its time cap counts the bytes it had delivered). TTP = (payload bytes / the scenario's link rate, its receivers' down direction, the slowest if several; the suite's line rate only where the link sets none) / wall time; G = payload bytes delivered / bytes the server sent on the wire (both as in seed 003; with several receivers G counts one copy, so multicast stays near 1 and unicast to two falls near 0.5). First byte: seconds until a file at a receiver had its first byte. The time series is what the emulator delivered per receiver per 100 ms (beside background traffic: less the background's bytes, counted once a second and spread evenly). Share: the tool's Mbit/s over the tool's and the background's together (fair beside N TCP flows: 1/(N+1)). CPU: user + system seconds of what the tool ran in the receivers (client) and in the server, children included.</p></body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(217.6), 500.0);
        assert_eq!(nice_max(1000.0), 1000.0);
        assert_eq!(nice_max(0.03), 0.05);
        assert_eq!(fmt_num(0.001), "0.001");
        assert_eq!(fmt_num(0.1 * 10f64.powi(-1)), "0.01");
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(2.5), "2.5");
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
