//! The words and numbers both reports print, in summary.md and in
//! report.html alike: short numbers, a value with its unit, resident
//! memory and latency, a dissemination run's cells, and the end of the CPU
//! sentence. [`crate::report`] and `html` both take them from here, and
//! neither from the other.

use crate::results::{rate_text, Results, Run};
use crate::scenario::Metric;

/// The end of both reports' CPU sentence (after "children included"): the
/// emulator's and the machine's CPU, and what the limit label means.
pub(crate) const CPU_NOTE: &str = ", and of the lab's emulator, which shares the machine's cores; machine CPU: core-seconds the whole machine was busy (/proc/stat: those, the kernel's packet work no process is charged for, and anything else). Limit: a label from those counters, not a proof: link (TTP at least 0.9), CPU (every core at least 85 % busy), receiver, sender or emulator CPU (one of them used at least 90 % of a core), or not CPU or link (the tool's windows, start-up, loss recovery or round trips per file).";

/// A number for a label: whole from 100 up, else a few significant digits.
pub(crate) fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else if v >= 0.001 {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        // 1e-4, 2e-5: not "0".
        format!("{v:.0e}")
    }
}

/// Three significant digits (0.937, 0.0141, 0.00290).
pub(crate) fn sig3(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = |x: f64| (2 - x.abs().log10().floor() as i32).max(0);
    // Rounded first: 0.9996 is "1.00", not "1.000".
    let scale = 10f64.powi(digits(v));
    let r = (v * scale).round() / scale;
    let d = digits(r) as usize;
    format!("{r:.d$}")
}

/// A value with its unit, as a bar or a table shows it.
pub(crate) fn metric_text(metric: Metric, v: f64) -> String {
    match metric {
        Metric::Mbps => {
            let t = rate_text(v);
            if t.ends_with("kbit/s") {
                t
            } else {
                format!("{t} Mbit/s")
            }
        }
        Metric::Seconds => format!("{} s", secs_text(v)),
        Metric::Ttp | Metric::Goodput | Metric::Share | Metric::Jain | Metric::Kept => sig3(v),
    }
}

/// Seconds to three significant digits (17.1, 1.04, 2210).
pub(crate) fn secs_text(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Whether `sc` is a dissemination scenario: one of its runs has
/// [`Run::feed`]. Its throughput numbers mean little (every tool is fed at
/// the same load), so the reports show what each receiver had, and when.
pub(crate) fn is_feed(r: &Results, sc: &str) -> bool {
    r.runs.iter().any(|x| x.scenario == sc && x.feed.is_some())
}

/// A resident-memory sample (kB as /proc counts them, 1024 bytes) in MB.
fn rss_mb(kb: u64) -> f64 {
    kb as f64 * 1024.0 / 1e6
}

/// Resident-memory samples as MB, "first→last" or with `with_max`
/// "first→max→last"; "-" without samples.
pub(crate) fn rss_text(samples: &[(f64, u64)], with_max: bool) -> String {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return "-".into();
    };
    let (a, z) = (rss_mb(first.1), rss_mb(last.1));
    if with_max {
        let m = rss_mb(samples.iter().map(|p| p.1).max().unwrap_or(0));
        format!("{a:.1}→{m:.1}→{z:.1}")
    } else {
        format!("{a:.1}→{z:.1}")
    }
}

/// A latency for a table: seconds with 2 decimals, "-" for none.
pub(crate) fn latency_text(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// A dissemination run's numbers for the per-run tables (markdown and
/// HTML): products, MB, producer s, load, s, sender CPU, sender RSS,
/// receivers' CPU, emulator CPU, runner CPU, machine CPU, the busiest 5 s;
/// `-` in each for a run that did not measure.
pub(crate) fn feed_cells(x: &Run) -> Vec<String> {
    let Some(f) = &x.feed else {
        return vec!["-".into(); 12];
    };
    vec![
        f.produced.to_string(),
        format!("{:.1}", f.produced_bytes as f64 / 1e6),
        fmt_num(f.seconds),
        rate_text(f.load_mbps),
        format!("{:.2}", x.wall_s),
        format!("{:.2}", f.sender_cpu_s),
        rss_text(&f.sender_rss_kb, true),
        format!("{:.2}", x.client_cpu_s),
        format!("{:.2}", x.emulator_cpu_s),
        format!("{:.2}", f.runner_cpu_s),
        format!("{:.2}", x.machine_cpu_s),
        f.busy_cores
            .iter()
            .map(|b| b.1)
            .reduce(f64::max)
            .map_or("-".into(), |b| format!("{b:.2}")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short_and_keep_their_significant_digits() {
        assert_eq!(fmt_num(0.001), "0.001");
        assert_eq!(fmt_num(2.5), "2.5");
        assert_eq!(fmt_num(17.1), "17.1");
        assert_eq!(fmt_num(0.0001), "1e-4");
        assert_eq!(sig3(0.0029), "0.00290");
        assert_eq!(sig3(0.937), "0.937");
        assert_eq!(sig3(0.0141), "0.0141");
        assert_eq!(sig3(0.9996), "1.00");
        assert_eq!(metric_text(Metric::Ttp, 0.0029), "0.00290");
    }

    #[test]
    fn values_carry_units_that_fit_their_size() {
        assert_eq!(metric_text(Metric::Mbps, 0.2134), "213 kbit/s");
        assert_eq!(metric_text(Metric::Mbps, 217.6), "217.6 Mbit/s");
        assert_eq!(metric_text(Metric::Seconds, 17.104), "17.1 s");
        assert_eq!(metric_text(Metric::Seconds, 1.043), "1.04 s");
        assert_eq!(metric_text(Metric::Seconds, 2210.0), "2210 s");
    }
}
