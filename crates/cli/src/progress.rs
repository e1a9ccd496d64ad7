//! A progress bar on a terminal: files done/total, bytes, current and mean rate, ETA.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use longhaul_quic::Progress;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

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

/// Start drawing unless `quiet` or stderr is not a terminal.
pub fn start(p: &Arc<Progress>, quiet: bool) -> Bar {
    if quiet || !std::io::stderr().is_terminal() {
        return Bar { task: None };
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed:>4} [{bar:30}] {bytes}/{total_bytes} {msg} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let (p, b) = (p.clone(), bar.clone());
    let task = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut last = (std::time::Instant::now(), 0u64);
        let mut rate = 0.0;
        // When the bytes done last changed, and to what.
        let mut moved = (started, 0u64);
        loop {
            tokio::select! {
                _ = &mut rx => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let done = Progress::get(&p.bytes_done);
            let now = std::time::Instant::now();
            let retrying = p.retrying();
            // (A new session counts its bytes afresh: not data moving.)
            if done != moved.1 && retrying.is_none() {
                moved = (now, done);
            }
            if let Some((lost, attempts)) = retrying {
                // (Since the last data: the loss is found after the idle
                // timeout's silence.)
                let quiet = now.duration_since(moved.0.min(lost)).as_secs();
                b.set_message(format!(
                    "link down, retrying ({}:{:02}; attempt {})",
                    quiet / 60,
                    quiet % 60,
                    attempts.max(1)
                ));
                last = (now, done);
                rate = 0.0;
                continue;
            }
            let dt = now.duration_since(last.0).as_secs_f64();
            if dt >= 0.5 {
                rate = (done.saturating_sub(last.1)) as f64 * 8.0 / dt / 1e6;
                last = (now, done);
            }
            let mean = done as f64 * 8.0 / started.elapsed().as_secs_f64() / 1e6;
            b.set_length(Progress::get(&p.bytes_total).max(done));
            b.set_position(done);
            let quiet = now.duration_since(moved.0).as_secs();
            let stalled = match quiet {
                // (A silent path is found lost after the 15 s idle timeout.)
                5.. if done > 0 => format!(", no data for {}:{:02}", quiet / 60, quiet % 60),
                _ => String::new(),
            };
            b.set_message(format!(
                "files {}/{} {:.0} Mbit/s (mean {:.0}){stalled}",
                Progress::get(&p.files_done),
                Progress::get(&p.files_total),
                rate,
                mean
            ));
        }
    });
    Bar {
        task: Some((task, tx, bar)),
    }
}
