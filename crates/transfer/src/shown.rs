//! Text from the far side, made safe to show: names and messages a peer
//! sends may hold control characters (an `ESC ]0;…BEL` retitles a terminal,
//! `ESC [2J` clears it, a newline forges a log line). Shown on a terminal or
//! written to a log, every control character (C0, DEL, C1) and every
//! Unicode bidirectional control is written as `\#ooo`, the octal of each of
//! its UTF-8 bytes, as rsync does; everything else stays as it is. JSON
//! output keeps the exact text (JSON escapes it itself).

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character written as `\#ooo` per byte.
pub fn shown(s: &str) -> Cow<'_, str> {
    escaped(s, false)
}

/// As [`shown`], but an ESC stays: for a log line whose own colours are
/// escape sequences, where the logger already escapes ESC in what it is
/// given (tracing-subscriber does).
pub fn shown_keeping_esc(s: &str) -> Cow<'_, str> {
    escaped(s, true)
}

fn escaped(s: &str, keep_esc: bool) -> Cow<'_, str> {
    let bad = |c: char| needs_escape(c) && !(keep_esc && c == '\x1b');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                let _ = write!(out, "\\#{byte:03o}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A control character, or a Unicode bidirectional control (which can make
/// a name read as another: `U+202E`, right-to-left override).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_kept() {
        assert!(matches!(shown("plain/näme ✓.txt"), Cow::Borrowed(_)));
        assert_eq!(
            shown("\x1b]0;pwned\x07\x1b[2J"),
            "\\#033]0;pwned\\#007\\#033[2J"
        );
        assert_eq!(shown("a\nb\r\tc\x7f"), "a\\#012b\\#015\\#011c\\#177");
        // C1 (two UTF-8 bytes) and a right-to-left override (three).
        assert_eq!(shown("x\u{9b}y"), "x\\#302\\#233y");
        assert_eq!(shown("gpj.\u{202e}exe"), "gpj.\\#342\\#200\\#256exe");
        assert_eq!(shown_keeping_esc("\x1b[1mok\n"), "\x1b[1mok\\#012");
    }
}
