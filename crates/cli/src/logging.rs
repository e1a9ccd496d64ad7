//! Log lines on stderr, and quinn-udp's socket errors counted instead.
//!
//! While a link is down the kernel refuses datagrams (EPERM from a firewall,
//! ENETUNREACH without a route), and quinn-udp logs a warning per socket
//! and minute, with the datagram's details: a transfer riding out an outage
//! tries many sockets. Those warnings are counted here, and a client says
//! them once, in one line, when it ends ([`socket_errors`]).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing_log::NormalizeEvent;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter::LevelFilter, Layer};

/// quinn-udp's warnings so far, and the first one's text.
static COUNT: AtomicU64 = AtomicU64::new(0);
static FIRST: Mutex<Option<String>> = Mutex::new(None);

/// The socket errors quinn-udp reported (each report stands for a socket's
/// errors over up to a minute) and the first one's text; None when none.
pub fn socket_errors() -> Option<(u64, String)> {
    let n = COUNT.load(Ordering::Relaxed);
    let first = FIRST.lock().unwrap().clone()?;
    Some((n, first))
}

/// Logs on stderr at `default_level` unless LONGHAUL_LOG says otherwise.
/// quinn-udp's warnings are counted, not printed, unless `print_socket` or
/// LONGHAUL_LOG names `quinn_udp` (a server's operator reads its log).
pub fn init(default_level: &str, print_socket: bool) {
    let user = std::env::var("LONGHAUL_LOG").ok();
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("LONGHAUL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let named = user.as_deref().is_some_and(|u| u.contains("quinn_udp"));
    if !print_socket && !named {
        filter = filter.add_directive("quinn_udp=error".parse().expect("valid directive"));
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(|| EscapingStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(filter);
    // (WARN bounds what the log crate's records cost: quinn logs through it.)
    let counted = SocketErrors.with_filter(LevelFilter::WARN);
    tracing_subscriber::registry()
        .with(fmt)
        .with(counted)
        .init();
}

/// Counts quinn-udp's warnings ([`COUNT`], [`FIRST`]).
struct SocketErrors;

impl<S: tracing::Subscriber> Layer<S> for SocketErrors {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        if !meta.target().starts_with("quinn_udp") {
            return;
        }
        if COUNT.fetch_add(1, Ordering::Relaxed) == 0 {
            let mut m = Message(String::new());
            event.record(&mut m);
            *FIRST.lock().unwrap() = Some(m.0);
        }
    }
}

/// An event's `message` field.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Stderr for log lines: the far side's names and messages in a line
/// cannot forge another line or reach the terminal as controls (each write
/// is one event, its newline at the end; the logger escapes ESC in what it
/// is given and colours the rest itself).
struct EscapingStderr;

impl Write for EscapingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, nl) = match text.strip_suffix('\n') {
            Some(l) => (l, "\n"),
            None => (&*text, ""),
        };
        let line = longhaul_transfer::shown::shown_keeping_esc(line);
        std::io::stderr().write_all(format!("{line}{nl}").as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quinn_udps_warnings_through_the_log_crate_are_counted_with_the_first_text() {
        // (The only test of this binary that installs the global logger.)
        super::init("warn", false);
        assert_eq!(super::socket_errors(), None);
        log::warn!(
            target: "quinn_udp::imp",
            "sendmsg error: Os {{ code: 1, message: \"Operation not permitted\" }}, Transmit: {{ len: 1200 }}"
        );
        log::warn!(target: "quinn_udp::imp", "sendmsg error: the second");
        // Others' warnings are not counted.
        log::warn!(target: "quinn_proto", "something else");
        tracing::warn!("and not ours either");
        let (n, first) = super::socket_errors().expect("counted");
        assert_eq!(n, 2);
        assert!(first.starts_with("sendmsg error: Os { code: 1"), "{first}");
    }
}
