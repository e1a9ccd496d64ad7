//! A progress line on a terminal: elapsed time, a bar, bytes done/total,
//! percent, current and mean rate, files, ETA. It fits the terminal's width:
//! as the terminal narrows, the least useful fields go first (the bar, the
//! mean rate, the elapsed time, the file count, the ETA), so the line never
//! wraps. Sizes are SI (kB, MB, GB), as in every flag and summary.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use longhaul_quic::Progress;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Bar {
    task: Option<(
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Sender<()>,
        ProgressBar,
    )>,
}

impl Bar {
    pub async fn finish(self) {
        if let Some((task, stop, bar)) = self.task {
            let _ = stop.send(());
            let _ = task.await;
            bar.finish_and_clear();
        }
    }
}

/// What one drawing of the line shows.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub elapsed: Duration,
    /// Bytes done and in all (0 before the manifest's first entry).
    pub done: u64,
    pub total: u64,
    /// Files settled and in all.
    pub files: (u64, u64),
    /// The rate over the last half second, and since the start, in Mbit/s.
    pub rate_mbps: f64,
    pub mean_mbps: f64,
    /// Shown instead of the rate and the ETA: the link is down, or no data
    /// came for a while.
    pub note: Option<String>,
}

/// The line's fields, in the order they are dropped as the width shrinks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Bar,
    Mean,
    Elapsed,
    Files,
    Eta,
    Percent,
    Rate,
}

const DROP_ORDER: [Field; 7] = [
    Field::Bar,
    Field::Mean,
    Field::Elapsed,
    Field::Files,
    Field::Eta,
    Field::Percent,
    Field::Rate,
];

/// The narrowest bar drawn (brackets included) and the widest.
const BAR_MIN: usize = 12;
const BAR_MAX: usize = 42;

/// `m:ss`, or `h:mm:ss` from an hour on.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        3600.. => format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60),
        _ => format!("{}:{:02}", s / 60, s % 60),
    }
}

/// A rate for people: `929 Mbit/s`, `3.2 Mbit/s`, `256 kbit/s`.
fn rate(mbps: f64) -> String {
    match mbps {
        r if r >= 9.95 => format!("{r:.0} Mbit/s"),
        r if r >= 1.0 => format!("{r:.1} Mbit/s"),
        0.0 => "0 Mbit/s".to_string(),
        r => format!("{:.0} kbit/s", r * 1e3),
    }
}

/// `1.21/2.00 GB`: both in the unit of the larger, SI.
fn bytes(done: u64, total: u64) -> String {
    let top = done.max(total) as f64;
    let (div, unit, prec) = match top {
        t if t >= 1e12 => (1e12, "TB", 2),
        t if t >= 1e9 => (1e9, "GB", 2),
        t if t >= 1e6 => (1e6, "MB", 1),
        t if t >= 1e3 => (1e3, "kB", 1),
        _ => (1.0, "B", 0),
    };
    let f = |b: u64| format!("{:.*}", prec, b as f64 / div);
    match total {
        0 => format!("{} {unit}", f(done)),
        t => format!("{}/{} {unit}", f(done), f(t)),
    }
}

/// The line for `frame`, at most `width` characters wide.
pub fn render(frame: &Frame, width: usize) -> String {
    let mut shown: Vec<Field> = DROP_ORDER.to_vec();
    loop {
        match compose(frame, &shown, width) {
            Some(line) if line.chars().count() <= width => return line,
            // The bytes and a note are never dropped: on a terminal too
            // narrow even for them, the line is cut.
            Some(line) if shown.is_empty() => {
                return line
                    .chars()
                    .take(width)
                    .collect::<String>()
                    .trim_end()
                    .into()
            }
            _ => {
                shown.remove(0);
            }
        }
    }
}

/// The line with the `shown` fields; None when the bar is asked for but
/// has too little room.
fn compose(f: &Frame, shown: &[Field], width: usize) -> Option<String> {
    let on = |x: Field| shown.contains(&x);
    let mut head = Vec::new();
    if on(Field::Elapsed) {
        head.push(clock(f.elapsed));
    }
    let mut tail = vec![bytes(f.done, f.total)];
    if on(Field::Percent) && f.total > 0 {
        tail.push(format!("{:.0}%", f.done as f64 * 100.0 / f.total as f64));
    }
    match &f.note {
        Some(note) => tail.push(note.clone()),
        None => {
            if on(Field::Rate) {
                tail.push(rate(f.rate_mbps));
            }
            if on(Field::Mean) {
                tail.push(format!("(mean {})", rate(f.mean_mbps)));
            }
        }
    }
    if on(Field::Files) && f.files.1 > 1 {
        tail.push(format!("files {}/{}", f.files.0, f.files.1));
    }
    if on(Field::Eta) && f.note.is_none() {
        let left = f.total.saturating_sub(f.done);
        let by = if f.rate_mbps > 0.0 {
            f.rate_mbps
        } else {
            f.mean_mbps
        };
        if left > 0 && by > 0.0 {
            let secs = left as f64 * 8.0 / (by * 1e6);
            if secs < 100.0 * 3600.0 {
                tail.push(format!("ETA {}", clock(Duration::from_secs_f64(secs))));
            }
        }
    }
    let text = |head: &[String], bar: Option<String>| {
        let mut parts: Vec<String> = head.to_vec();
        parts.extend(bar);
        parts.extend(tail.iter().cloned());
        parts.join(" ")
    };
    let plain = text(&head, None);
    if !on(Field::Bar) || f.total == 0 {
        return Some(plain);
    }
    let room = width.saturating_sub(plain.chars().count() + 1).min(BAR_MAX);
    if room < BAR_MIN {
        return None;
    }
    let inner = room - 2;
    let filled = ((f.done.min(f.total) as f64 / f.total as f64) * inner as f64) as usize;
    let mut bar = String::with_capacity(room);
    bar.push('[');
    bar.push_str(&"=".repeat(filled));
    if filled < inner {
        bar.push('>');
        bar.push_str(&" ".repeat(inner - filled - 1));
    }
    bar.push(']');
    Some(text(&head, Some(bar)))
}

/// The terminal's width on stderr, less one column (a line that ends in the
/// last column makes some terminals wrap), or 79 when unknown.
fn width() -> usize {
    console::Term::stderr()
        .size_checked()
        .map_or(80, |(_rows, cols)| cols as usize)
        .max(2)
        - 1
}

/// Start drawing unless `quiet` or stderr is not a terminal.
pub fn start(p: &Arc<Progress>, quiet: bool) -> Bar {
    if quiet || !std::io::stderr().is_terminal() {
        return Bar { task: None };
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
    bar.set_style(ProgressStyle::with_template("{msg}").expect("valid template"));
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let (p, b) = (p.clone(), bar.clone());
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut last = (Instant::now(), 0u64);
        // The rate over the last half second; the mean until there is one.
        let mut rate = None;
        // When the bytes done last changed, and to what.
        let mut moved = (started, 0u64);
        loop {
            tokio::select! {
                _ = &mut rx => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let done = Progress::get(&p.bytes_done);
            let now = Instant::now();
            let retrying = p.retrying();
            // (A new session counts its bytes afresh: not data moving.)
            if done != moved.1 && retrying.is_none() {
                moved = (now, done);
            }
            let mut frame = Frame {
                elapsed: started.elapsed(),
                done,
                total: Progress::get(&p.bytes_total).max(done),
                files: (Progress::get(&p.files_done), Progress::get(&p.files_total)),
                mean_mbps: done as f64 * 8.0 / started.elapsed().as_secs_f64() / 1e6,
                ..Frame::default()
            };
            if let Some((lost, attempts)) = retrying {
                // (Since the last data: the loss is found after the idle
                // timeout's silence.)
                let quiet = now.duration_since(moved.0.min(lost));
                frame.note = Some(format!(
                    "link down, retrying ({}; attempt {})",
                    clock(quiet),
                    attempts.max(1)
                ));
                last = (now, done);
                rate = Some(0.0);
            } else {
                let dt = now.duration_since(last.0).as_secs_f64();
                if dt >= 0.5 {
                    rate = Some((done.saturating_sub(last.1)) as f64 * 8.0 / dt / 1e6);
                    last = (now, done);
                }
                frame.rate_mbps = rate.unwrap_or(frame.mean_mbps);
                let quiet = now.duration_since(moved.0);
                // (A silent path is found lost after the 15 s idle timeout.)
                if quiet >= Duration::from_secs(5) && done > 0 {
                    frame.note = Some(format!("no data for {}", clock(quiet)));
                }
            }
            b.set_message(render(&frame, width()));
        }
    });
    Bar {
        task: Some((task, tx, bar)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> Frame {
        Frame {
            elapsed: Duration::from_secs(75),
            done: 1_210_000_000,
            total: 2_000_000_000,
            files: (3, 10),
            rate_mbps: 929.4,
            mean_mbps: 901.0,
            note: None,
        }
    }

    #[test]
    fn a_wide_terminal_gets_every_field() {
        let l = render(&frame(), 120);
        assert!(l.chars().count() <= 120, "{l}");
        for part in [
            "1:15 [",
            "] 1.21/2.00 GB 60% 929 Mbit/s (mean 901 Mbit/s) files 3/10 ETA 0:06",
        ] {
            assert!(l.contains(part), "{part:?} not in {l:?}");
        }
    }

    #[test]
    fn fields_go_least_useful_first_and_the_line_never_exceeds_the_width() {
        let f = frame();
        let mut seen = Vec::new();
        for w in (10..=120).rev() {
            let l = render(&f, w);
            assert!(l.chars().count() <= w, "width {w}: {l:?}");
            assert!(!l.contains("MiB") && !l.contains("GiB"), "{l}");
            seen.push((w, l));
        }
        let at = |w: usize| &seen.iter().find(|(x, _)| *x == w).unwrap().1;
        // 100 columns: everything; 80: all but the bar.
        assert!(at(99).contains("] 1.21/2.00 GB"), "{}", at(99));
        assert_eq!(
            at(79),
            "1:15 1.21/2.00 GB 60% 929 Mbit/s (mean 901 Mbit/s) files 3/10 ETA 0:06"
        );
        // 40 columns: bytes, percent, rate and ETA are what matter.
        assert_eq!(at(40), "1.21/2.00 GB 60% 929 Mbit/s ETA 0:06");
        assert_eq!(at(30), "1.21/2.00 GB 60% 929 Mbit/s");
        assert_eq!(at(12), "1.21/2.00 GB");
        assert_eq!(at(10), "1.21/2.00");
        // A field once dropped stays dropped as the width shrinks.
        for (w, l) in &seen {
            if *w < 70 {
                assert!(!l.contains("mean"), "width {w}: {l}");
            }
        }
    }

    #[test]
    fn a_note_replaces_the_rate_and_the_eta() {
        let f = Frame {
            note: Some("link down, retrying (0:23; attempt 3)".into()),
            ..frame()
        };
        let l = render(&f, 79);
        assert!(l.contains("link down, retrying (0:23; attempt 3)"), "{l}");
        assert!(!l.contains("ETA") && !l.contains("Mbit/s"), "{l}");
        let l = render(&f, 50);
        assert_eq!(l, "1.21/2.00 GB link down, retrying (0:23; attempt 3)");
    }

    #[test]
    fn units_are_si_and_follow_the_size() {
        assert_eq!(bytes(512, 900), "512/900 B");
        assert_eq!(bytes(12_300, 45_000), "12.3/45.0 kB");
        assert_eq!(bytes(1_500_000, 0), "1.5 MB");
        assert_eq!(bytes(999_000_000, 16_490_000_000_000), "0.00/16.49 TB");
        assert_eq!(rate(0.256), "256 kbit/s");
        assert_eq!(rate(0.0), "0 Mbit/s");
        assert_eq!(rate(3.21), "3.2 Mbit/s");
        assert_eq!(rate(1841.2), "1841 Mbit/s");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
    }

    #[test]
    fn before_the_manifest_the_line_shows_what_came() {
        let f = Frame {
            total: 0,
            done: 0,
            files: (0, 0),
            ..frame()
        };
        assert_eq!(render(&f, 79), "1:15 0 B 929 Mbit/s (mean 901 Mbit/s)");
    }
}
