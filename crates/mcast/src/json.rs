//! How the reports appear in `--json` output: a session id as 16 hex digits,
//! durations as seconds (f64), addresses as `ip:port` strings.

use serde::Serializer;
use std::time::Duration;

pub(crate) fn session_hex<S: Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:016x}"))
}

pub(crate) fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

pub(crate) fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use crate::{ReceiveReport, RxReport, RxState};
    use std::time::Duration;

    #[test]
    fn a_receive_report_reads_as_the_ended_event_always_has() {
        let r = ReceiveReport {
            session: 0xab,
            sender: "10.0.0.1:4000".parse().unwrap(),
            ok: true,
            error: String::new(),
            files: 2,
            bytes: 1000,
            packets: 9,
            lost: 1,
            decoded_blocks: 3,
            decode_failures: 0,
            first_data: Some(Duration::from_millis(250)),
            data_done: None,
            verify_time: Duration::from_millis(500),
            elapsed: Duration::from_secs(2),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["session"], "00000000000000ab");
        assert_eq!(v["sender"], "10.0.0.1:4000");
        assert_eq!(v["first_data_seconds"], 0.25);
        assert!(v["data_done_seconds"].is_null());
        assert_eq!(v["verify_seconds"], 0.5);
        assert_eq!(v["seconds"], 2.0);
        assert_eq!(v["decoded_blocks"], 3);
    }

    #[test]
    fn a_receiver_as_the_sender_saw_it_has_state_reason_and_rate() {
        let mut r = RxReport {
            name: "site1".into(),
            addr: None,
            state: RxState::Completed,
            rtt: Some(Duration::from_millis(70)),
            bytes: 1_000_000,
            packets: 800,
            lost: 8,
            loss_ppm: 10_000,
            passes: 1,
            time: Some(Duration::from_secs(2)),
            late: false,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["state"], "completed");
        assert_eq!(v["reason"], "");
        assert_eq!(v["loss"], 0.01);
        assert_eq!(v["rtt_ms"], 70.0);
        assert_eq!(v["mbps"], 4.0);
        assert!(v["addr"].is_null());
        r.state = RxState::GaveUp("silent for 3 polls".into());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["state"], "given up");
        assert_eq!(v["reason"], "silent for 3 polls");
        assert!(
            v["mbps"].is_null(),
            "no rate for a receiver that did not complete"
        );
    }
}
