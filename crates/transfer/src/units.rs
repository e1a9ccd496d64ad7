//! One grammar of units for every flag, link SPEC and suite file: sizes in
//! bytes, rates in bit/s, durations. Prefixes are SI unless written binary:
//!
//! | written | size (bytes) | rate (bit/s) |
//! |---|---|---|
//! | `k` `K` `kB` `KB` | 10³ | 10³ (`k`, `kbit`, `kbps`) |
//! | `M` `MB` | 10⁶ | 10⁶ |
//! | `G` `GB` | 10⁹ | 10⁹ |
//! | `T` `TB` | 10¹² | 10¹² |
//! | `Ki` `KiB` | 2¹⁰ | — |
//! | `Mi` `MiB` | 2²⁰ | — |
//! | `Gi` `GiB` | 2³⁰ | — |
//! | `Ti` `TiB` | 2⁴⁰ | — |
//!
//! A rate may also be given in bytes per second: `50MB/s` is 400 Mbit/s.
//! Durations take `ns`, `us` (or `µs`), `ms`, `s`, `m` (or `min`), `h` and `d`;
//! only `0` may go without a unit. Numbers may have a fraction (`2.5G`,
//! `1.5s`). Each caller checks the range it accepts.

use std::time::Duration;

/// A value that does not follow the grammar; the message shows how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

/// Splits `12.5MiB` into (12.5, "MiB").
fn split(s: &str) -> Option<(f64, &str)> {
    let t = s.trim();
    let at = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    // An `e` only as an exponent (1e9), not the start of a unit.
    let at = match t[..at].rfind('e') {
        Some(e) if !t[e + 1..at].starts_with(|c: char| c.is_ascii_digit() || c == '-') => e,
        _ => at,
    };
    let n: f64 = t[..at].parse().ok()?;
    (n.is_finite() && n >= 0.0).then_some((n, t[at..].trim()))
}

fn whole(v: f64, what: &str, s: &str) -> Result<u64, UnitError> {
    if v.fract() != 0.0 || v > 1.8e19 {
        return Err(UnitError(format!(
            "{what} {s:?} is not a whole number of {}",
            if what == "size" { "bytes" } else { "bit/s" }
        )));
    }
    Ok(v as u64)
}

/// A size in bytes: `300`, `300B`, `10kB`, `5MB`, `2G`, `64KiB`, `1GiB`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let bad = || {
        UnitError(format!(
            "size {s:?}: write bytes with an SI or binary prefix, like 10kB, 5MB, 2G, 64KiB or 1GiB"
        ))
    };
    let (n, unit) = split(s).ok_or_else(bad)?;
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let mult: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    whole(snap(n * mult), "size", s)
}

/// A rate in bit/s: `1G`, `400M`, `256k`, `2.5Gbit`, `10mbps`, `1500000`,
/// or bytes per second: `50MB/s`.
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let bad = || {
        UnitError(format!(
            "rate {s:?}: write bit/s like 1G, 400M, 256k or 2.5Gbit (or bytes/s: 50MB/s)"
        ))
    };
    let (n, unit) = split(s).ok_or_else(bad)?;
    let (unit, bytes) = match unit.strip_suffix("B/s") {
        Some(u) => (u, true),
        None => (unit, false),
    };
    let unit = if bytes {
        unit
    } else {
        let lower = unit.strip_suffix("bit/s").unwrap_or(unit);
        let lower = lower.strip_suffix("bps").unwrap_or(lower);
        let lower = lower.strip_suffix("bit").unwrap_or(lower);
        lower.strip_suffix('b').unwrap_or(lower)
    };
    let mult: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "m" | "M" => 1e6,
        "g" | "G" => 1e9,
        "t" | "T" => 1e12,
        _ => return Err(bad()),
    };
    let bits = n * mult * if bytes { 8.0 } else { 1.0 };
    whole(bits.round(), "rate", s)
}

/// A size for people, in SI units: `512 B`, `12.3 kB`, `1.50 MB`, `16.49 TB`.
pub fn show_size(b: u64) -> String {
    let f = b as f64;
    match f {
        _ if f >= 1e15 => format!("{:.2} PB", f / 1e15),
        _ if f >= 1e12 => format!("{:.2} TB", f / 1e12),
        _ if f >= 1e9 => format!("{:.2} GB", f / 1e9),
        _ if f >= 1e6 => format!("{:.2} MB", f / 1e6),
        _ if f >= 1e3 => format!("{:.1} kB", f / 1e3),
        _ => format!("{b} B"),
    }
}

/// A duration: `35ms`, `1.5s`, `500us`, `5m`, `1h`, `7d`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let bad = || {
        UnitError(format!(
            "duration {s:?}: write a number and a unit, like 35ms, 1.5s, 500us, 5m, 1h or 7d"
        ))
    };
    let (n, unit) = split(s).ok_or_else(bad)?;
    let secs = match unit {
        "" if n == 0.0 => 0.0,
        "" => {
            return Err(UnitError(format!(
                "duration {s:?} needs a unit: 35ms, 1.5s, 500us, 5m or 1h"
            )))
        }
        "ns" => n * 1e-9,
        "us" | "µs" => n * 1e-6,
        "ms" => n * 1e-3,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// Rounds a product like 0.1 × 1e3 (= 100.00000000000001) to the whole
/// number it means; leaves real fractions alone.
fn snap(v: f64) -> f64 {
    let r = v.round();
    if (v - r).abs() <= 1e-6 * r.abs().max(1.0) {
        r
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_si_unless_binary() {
        for (s, v) in [
            ("300", 300),
            ("300B", 300),
            ("10kB", 10_000),
            ("10k", 10_000),
            ("10KB", 10_000),
            ("5MB", 5_000_000),
            ("2G", 2_000_000_000),
            ("1.5GB", 1_500_000_000),
            ("1TB", 1_000_000_000_000),
            ("64KiB", 65_536),
            ("64Ki", 65_536),
            ("1MiB", 1 << 20),
            ("1GiB", 1 << 30),
            ("2TiB", 2 << 40),
            ("0.5MiB", 1 << 19),
            ("0.1k", 100),
            (" 7 MB ", 7_000_000),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for s in ["", "lots", "1.5", "1Mb", "1mB", "-3", "1 GiBB", "0.3B"] {
            let e = parse_size(s).unwrap_err().to_string();
            assert!(e.contains(&format!("{s:?}")), "{s}: {e}");
        }
    }

    #[test]
    fn rates_are_bits_per_second() {
        for (s, v) in [
            ("1G", 1_000_000_000),
            ("400M", 400_000_000),
            ("256k", 256_000),
            ("2.5Gbit", 2_500_000_000),
            ("10mbps", 10_000_000),
            ("100Mbit/s", 100_000_000),
            ("1500000", 1_500_000),
            ("1e9", 1_000_000_000),
            ("50MB/s", 400_000_000),
            ("1kB/s", 8_000),
        ] {
            assert_eq!(parse_rate(s), Ok(v), "{s}");
        }
        for s in ["fast", "1Gi", "1MiB/s", "G", "1x"] {
            assert!(parse_rate(s).is_err(), "{s}");
        }
    }

    #[test]
    fn sizes_are_shown_in_si_units() {
        assert_eq!(show_size(512), "512 B");
        assert_eq!(show_size(12_345), "12.3 kB");
        assert_eq!(show_size(20 << 20), "20.97 MB");
        assert_eq!(show_size(16 << 40), "17.59 TB");
        assert_eq!(show_size(3_200_000_000_000_000), "3.20 PB");
    }

    #[test]
    fn durations_need_a_unit() {
        for (s, ms) in [
            ("35ms", 35.0),
            ("1.5s", 1500.0),
            ("500us", 0.5),
            ("500µs", 0.5),
            ("2000ns", 0.002),
            ("5m", 300_000.0),
            ("5min", 300_000.0),
            ("1h", 3_600_000.0),
            ("7d", 604_800_000.0),
            ("0", 0.0),
        ] {
            let d = parse_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert!((d.as_secs_f64() * 1e3 - ms).abs() < 1e-9, "{s}: {d:?}");
        }
        for s in ["30", "1w", "ms", "-1s", "soon"] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        let e = parse_duration("30").unwrap_err().to_string();
        assert!(e.contains("needs a unit"), "{e}");
    }
}
