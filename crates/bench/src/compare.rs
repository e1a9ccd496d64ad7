//! Two builds' runs of the same suite, side by side (`longhaul lab compare`).
//!
//! On two shared cores a build's rate moves by 5-10 % between runs and by
//! more between hours, so a change is judged from many runs of both builds
//! made in turns: for each scenario and tool, the runs' median and
//! quartiles on each side, the change in medians, and the two-sided
//! p-value of a rank-sum (Mann-Whitney U) test of the rates, with the
//! median CPU of each end and of the emulator. A p-value over 0.05 says the
//! difference lies within what the runs' spread gives by chance.

use crate::results::{Results, Run, Status};
use crate::scenario::glob;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// Only this tool label (all tools when None).
    pub tool: Option<String>,
    /// Only scenarios matching one of these globs.
    pub scenarios: Option<Vec<String>>,
}

/// The markdown table of `before` against `after`: one row per scenario
/// and tool that ran on both sides (runs that did not end `ok` are left out
/// and counted).
pub fn table(before: &[Results], after: &[Results], choice: &Choice) -> String {
    let pick = |all: &[Results]| {
        let mut by: BTreeMap<(String, String), Vec<Run>> = BTreeMap::new();
        let mut left_out = 0usize;
        for run in all.iter().flat_map(|r| r.runs.iter()) {
            if choice.tool.as_ref().is_some_and(|t| *t != run.tool) {
                continue;
            }
            if let Some(globs) = &choice.scenarios {
                if !globs.iter().any(|g| glob(g, &run.scenario)) {
                    continue;
                }
            }
            if run.status != Status::Ok {
                left_out += 1;
                continue;
            }
            by.entry((run.scenario.clone(), run.tool.clone()))
                .or_default()
                .push(run.clone());
        }
        (by, left_out)
    };
    let (b, b_out) = pick(before);
    let (a, a_out) = pick(after);
    let mut out = String::new();
    out.push_str(
        "| scenario | tool | before: Mbit/s median (quartiles), runs | after | change | p | CPU-s client / server / emulator, before → after |\n\
         |---|---|---|---|---:|---:|---|\n",
    );
    for (key, runs_b) in &b {
        let Some(runs_a) = a.get(key) else { continue };
        let rates = |r: &[Run]| r.iter().map(|x| x.mbps).collect::<Vec<_>>();
        let (rb, ra) = (rates(runs_b), rates(runs_a));
        let (qb, qa) = (quartiles(&rb), quartiles(&ra));
        let p = rank_sum_p(&rb, &ra);
        let cpu = |r: &[Run]| {
            let m = |f: fn(&Run) -> f64| median(&r.iter().map(f).collect::<Vec<_>>());
            format!(
                "{:.3} / {:.3} / {:.3}",
                m(|x| x.client_cpu_s),
                m(|x| x.server_cpu_s),
                m(|x| x.emulator_cpu_s)
            )
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} ({:.1}-{:.1}), {} | {:.1} ({:.1}-{:.1}), {} | {:+.1} % | {:.3} | {} → {} |",
            key.0,
            key.1,
            qb.1,
            qb.0,
            qb.2,
            rb.len(),
            qa.1,
            qa.0,
            qa.2,
            ra.len(),
            (qa.1 / qb.1 - 1.0) * 100.0,
            p,
            cpu(runs_b),
            cpu(runs_a)
        );
    }
    if b_out + a_out > 0 {
        let _ = writeln!(
            out,
            "\nLeft out: {b_out} run(s) before and {a_out} after that did not end ok."
        );
    }
    out.push_str(
        "\np: two-sided rank-sum (Mann-Whitney U) test of the rates; over 0.05 the \
         difference lies within the runs' spread.\n",
    );
    out
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    quartiles(v).1
}

/// First quartile, median and third quartile of `v` (linear between the
/// closest ranks, so the median of an even count is the mean of the middle
/// two; NaN when empty). README's tables take their medians from here
/// (`numbers`).
pub fn quartiles(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let x = q * (s.len() - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        // (Weighted so that halfway is exactly (a + b) / 2.)
        let f = x - lo as f64;
        s[lo] * (1.0 - f) + s[hi] * f
    };
    (at(0.25), at(0.5), at(0.75))
}

/// Two-sided p-value of the rank-sum test of `a` against `b`: the normal
/// approximation of U with the correction for ties and for continuity
/// (as scipy's `mannwhitneyu(..., method="asymptotic")`). 1 when either is
/// empty or every value is the same.
pub fn rank_sum_p(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut r1, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1..=j+1 share their mean.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        r1 += rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let u = r1 - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let nn = n1 + n2;
    let var = n1 * n2 / 12.0 * ((nn + 1.0) - ties / (nn * (nn - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / var.sqrt();
    erfc(z / std::f64::consts::SQRT_2).min(1.0)
}

/// The complementary error function, for x >= 0 (W. J. Cody's rational
/// Chebyshev form as in Numerical Recipes' `erfcc`: relative error under
/// 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_sum_test_agrees_with_scipy() {
        // scipy.stats.mannwhitneyu(a, b, method="asymptotic") (continuity
        // and tie corrections on): 0.012186 and 0.4632.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [6.0, 7.0, 8.0, 9.0, 10.0];
        assert!((rank_sum_p(&a, &b) - 0.012186).abs() < 1e-5);
        assert!((rank_sum_p(&b, &a) - 0.012186).abs() < 1e-5);
        let a = [760.0, 771.0, 745.0, 790.0, 771.0, 733.0];
        let b = [771.0, 780.0, 752.0, 748.0, 795.0, 771.0];
        assert!(
            (rank_sum_p(&a, &b) - 0.4632).abs() < 1e-4,
            "{}",
            rank_sum_p(&a, &b)
        );
        // Nothing to tell apart.
        assert_eq!(rank_sum_p(&[5.0; 4], &[5.0; 3]), 1.0);
        assert_eq!(rank_sum_p(&[], &[1.0]), 1.0);
    }

    /// A kept suite's runs against the same runs with longhaul 10 % faster
    /// and one run failed: longhaul's rows say +10 %, the failed run is
    /// left out and counted, and a scenario left with no runs on one side
    /// has no row.
    #[test]
    fn a_row_holds_both_sides_medians_and_what_was_left_out() {
        let before: Results =
            serde_json::from_str(include_str!("../../../docs/results/startup/results.json"))
                .unwrap();
        let mut after = before.clone();
        for r in after.runs.iter_mut().filter(|r| r.tool == "longhaul") {
            r.mbps *= 1.1;
        }
        let gone = after
            .runs
            .iter_mut()
            .find(|r| r.tool == "longhaul")
            .unwrap();
        gone.status = Status::Failed;
        let gone = gone.scenario.clone();
        let choice = Choice {
            tool: Some("longhaul".into()),
            scenarios: None,
        };
        let t = table(
            std::slice::from_ref(&before),
            std::slice::from_ref(&after),
            &choice,
        );
        let rows: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
            .collect();
        let scenarios: std::collections::BTreeSet<_> = before
            .runs
            .iter()
            .filter(|r| r.tool == "longhaul" && r.scenario != gone)
            .map(|r| r.scenario.clone())
            .collect();
        assert_eq!(rows.len(), scenarios.len(), "{t}");
        for sc in &scenarios {
            let row = rows
                .iter()
                .find(|l| l.starts_with(&format!("| {sc} | longhaul |")))
                .unwrap();
            let m = before
                .runs
                .iter()
                .find(|r| &r.scenario == sc && r.tool == "longhaul")
                .unwrap()
                .mbps;
            assert!(
                row.contains(&format!("| {m:.1} ({m:.1}-{m:.1}), 1 |"))
                    && row.contains("| +10.0 % |"),
                "{row}"
            );
        }
        assert!(t.contains("Left out: 0 run(s) before and 1 after"), "{t}");
    }

    #[test]
    fn erfc_is_close_to_its_table_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_1),
            (1.0, 0.157_299_2),
            (2.0, 0.004_677_7),
        ] {
            assert!((erfc(x) - want).abs() < 1e-6, "erfc({x})");
        }
    }

    #[test]
    fn the_median_takes_the_middle_or_the_mean_of_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[0.1, 0.7]), (0.1 + 0.7) / 2.0);
    }

    #[test]
    fn quartiles_interpolate_between_ranks() {
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), (2.0, 3.0, 4.0));
        assert_eq!(quartiles(&[1.0, 2.0]), (1.25, 1.5, 1.75));
        assert!(median(&[]).is_nan());
    }
}
