//! The hidden files longhaul keeps beside a target while it receives it: its
//! part (`.NAME.lh-part`), its journal (`.NAME.lh-journal`) and a link
//! being made (`.NAME.lh-link`); how they are named, and how a walk or a
//! receiver tells them from the files of a tree.

/// Hidden sibling name `.NAME.SUFFIX`, or a hashed name when that would be too long.
pub fn sibling_name(name: &[u8], suffix: &str) -> Vec<u8> {
    if name.len() + suffix.len() + 2 <= crate::path::MAX_NAME_LEN {
        let mut v = Vec::with_capacity(name.len() + suffix.len() + 2);
        v.push(b'.');
        v.extend_from_slice(name);
        v.push(b'.');
        v.extend_from_slice(suffix.as_bytes());
        v
    } else {
        let h = blake3::hash(name).to_hex();
        format!(".lh-{}.{suffix}", &h[..32]).into_bytes()
    }
}

/// A name of the form longhaul gives its own part, journal and link files
/// (`.NAME.lh-part` or `.lh-HASH.lh-part`, and the same with `lh-journal`,
/// `lh-link`). A sender's walk skips them and a receiver refuses entries by
/// such names: received, one would be the part of the file it is named
/// after, and be truncated, renamed or removed with it.
pub fn is_reserved_name(name: &[u8]) -> bool {
    name.first() == Some(&b'.')
        && ([PART, JOURNAL, LINK, PLAN].iter().any(|s| {
            name.len() > s.len() + 2
                && name.ends_with(s.as_bytes())
                && name[name.len() - s.len() - 1] == b'.'
        }) || is_slice_journal(name))
}

/// `.NAME.lh-slice-K-N`: a shard's journal of its slice of NAME
/// ([`crate::slice`]).
fn is_slice_journal(name: &[u8]) -> bool {
    let Some(dot) = name.iter().rposition(|&b| b == b'.') else {
        return false;
    };
    let Some(rest) = name[dot + 1..].strip_prefix(crate::slice::SLICE.as_bytes()) else {
        return false;
    };
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    dot > 1
        && rest.first() == Some(&b'-')
        && rest[1..]
            .iter()
            .position(|&b| b == b'-')
            .is_some_and(|m| digits(&rest[1..1 + m]) && digits(&rest[2 + m..]))
}

/// Suffix of a part file: the hidden `.NAME.lh-part` beside its target that data
/// is written to until it is verified and renamed.
pub const PART: &str = "lh-part";
/// Suffix of a resume journal: `.NAME.lh-journal` beside the part of a file of
/// several chunks.
pub const JOURNAL: &str = "lh-journal";
/// Suffix of a shard plan file (`--shard`, [`crate::shard::PlanFile`]):
/// `.longhaul.lh-plan` in a destination directory by default.
pub const PLAN: &str = "lh-plan";
/// Suffix of the temporary name a symlink, a hard link or a special file is
/// made under before it is renamed to its own.
pub(crate) const LINK: &str = "lh-link";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_journal_and_link_names_are_reserved() {
        for suffix in [PART, JOURNAL, LINK, PLAN, "lh-slice-1-2", "lh-slice-12-400"] {
            assert!(is_reserved_name(&sibling_name(b"x", suffix)));
            assert!(is_reserved_name(&sibling_name(&[b'n'; 250], suffix)));
        }
        for name in [
            &b"x.lh-part"[..],
            b".lh-part",
            b"..lh-part",
            b".x.lh-parts",
            b".xlh-journal",
            b".x.lh-slice-1",
            b".x.lh-slice-1-",
            b".x.lh-slice--2",
            b".x.lh-slice-a-2",
            b"..lh-slice-1-2",
            b"x",
            b"",
        ] {
            assert!(!is_reserved_name(name), "{}", String::from_utf8_lossy(name));
        }
    }
}
