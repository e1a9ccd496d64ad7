//! `--exclude`, `--include` and `--exclude-from`: which items of a tree a
//! sender leaves out, by rsync's rules.
//!
//! Rules are tried in order and the first whose pattern matches decides; an
//! item no rule matches is sent. A directory left out is not walked, so
//! nothing beneath it is sent whatever a later rule says (as in rsync).
//!
//! A pattern is matched against an item's path as it lands beneath the
//! destination (a root sent as `dir` contributes `dir/`, one sent as `dir/`
//! nothing), as rsync matches against the path from its transfer root:
//! - a trailing `/` matches only a directory (the `/` is not part of the
//!   pattern);
//! - a leading `/` anchors the pattern at the root;
//! - otherwise a pattern without a `/` (a trailing one aside) and without
//!   `**` is matched against the last component only, and one with them
//!   against any trailing run of whole components (at any depth);
//! - `*` matches any characters but `/`, `**` any characters, `?` one
//!   character but `/`, `[...]` one character of a class (`[!...]` or
//!   `[^...]` negated, ranges `a-z`), `\` makes the next character plain;
//! - `dir/***` matches `dir` itself and everything beneath it.
//!
//! Not supported (refused with a clear error): rsync's merge-file and
//! modifier syntax (`:`, `.`, `!` rules, `+`/`-` with modifiers).

use serde::{Deserialize, Serialize};

/// Whether a rule keeps or leaves out what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// `--include`: send it (and stop looking).
    Include,
    /// `--exclude`: leave it out (a directory: and everything beneath).
    Exclude,
}

/// One rule: an action and a pattern as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Include or exclude.
    pub action: Action,
    /// The pattern, as written (bytes: names are bytes).
    pub pattern: Vec<u8>,
}

/// A refused rule, naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter rule {rule:?}: {why}")]
pub struct FilterError {
    /// The rule as written.
    pub rule: String,
    /// Why it is refused.
    pub why: String,
}

/// Rules parsed once and matched against many paths.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Compiled>,
}

#[derive(Debug, Clone)]
struct Compiled {
    action: Action,
    /// The pattern without its leading `/` and trailing `/`.
    pat: Vec<u8>,
    anchored: bool,
    dir_only: bool,
    /// Matched against the whole path (a `/` or `**` in it), else the last
    /// component.
    whole: bool,
}

impl Filter {
    /// The rules in order; an empty list keeps everything.
    pub fn new(rules: &[Rule]) -> Result<Filter, FilterError> {
        let mut out = Vec::with_capacity(rules.len());
        for r in rules {
            let bad = |why: &str| FilterError {
                rule: String::from_utf8_lossy(&r.pattern).into_owned(),
                why: why.into(),
            };
            let mut p: &[u8] = &r.pattern;
            if p.is_empty() {
                return Err(bad("an empty pattern"));
            }
            let anchored = p.starts_with(b"/");
            if anchored {
                p = &p[1..];
            }
            let mut dir_only = false;
            while p.len() > 1 && p.ends_with(b"/") {
                dir_only = true;
                p = &p[..p.len() - 1];
            }
            if p == b"/" || p.is_empty() {
                return Err(bad("a pattern of slashes only"));
            }
            let whole = anchored || p.contains(&b'/') || contains(p, b"**");
            out.push(Compiled {
                action: r.action,
                pat: p.to_vec(),
                anchored,
                dir_only,
                whole,
            });
        }
        Ok(Filter { rules: out })
    }

    /// No rules: everything is sent.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether the item at `path` (its path as it lands, `/`-separated,
    /// without a leading `/`; `is_dir` for a directory) is left out.
    pub fn excludes(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() {
            return false; // the destination itself
        }
        for r in &self.rules {
            if r.dir_only && !is_dir {
                continue;
            }
            if r.matches(path) {
                return r.action == Action::Exclude;
            }
        }
        false
    }
}

impl Compiled {
    fn matches(&self, path: &[u8]) -> bool {
        if !self.whole {
            let last = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
            return glob(&self.pat, last);
        }
        // `dir/***`: the directory itself too.
        if let Some(base) = self.pat.strip_suffix(b"/***") {
            let me = Compiled {
                pat: base.to_vec(),
                ..self.clone()
            };
            if me.matches(path) {
                return true;
            }
        }
        if self.anchored {
            return glob(&self.pat, path);
        }
        // Any trailing run of whole components.
        let mut start = 0;
        loop {
            if glob(&self.pat, &path[start..]) {
                return true;
            }
            match path[start..].iter().position(|&b| b == b'/') {
                Some(i) => start += i + 1,
                None => return false,
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether `pat` matches all of `s` (see the module's wildcards).
fn glob(pat: &[u8], s: &[u8]) -> bool {
    match pat.first() {
        None => s.is_empty(),
        Some(b'*') => {
            let deep = pat.get(1) == Some(&b'*');
            let mut rest = &pat[if deep { 2 } else { 1 }..];
            // (`***` is `**` followed by `*`: as deep.)
            while deep && rest.first() == Some(&b'*') {
                rest = &rest[1..];
            }
            for i in 0..=s.len() {
                if glob(rest, &s[i..]) {
                    return true;
                }
                if i < s.len() && s[i] == b'/' && !deep {
                    return false;
                }
            }
            false
        }
        Some(b'?') => !s.is_empty() && s[0] != b'/' && glob(&pat[1..], &s[1..]),
        Some(b'[') => match class(&pat[1..], s.first().copied()) {
            Some((true, used)) => glob(&pat[1 + used..], &s[1..]),
            Some((false, _)) => false,
            // (No closing `]`: a plain `[`.)
            None => s.first() == Some(&b'[') && glob(&pat[1..], &s[1..]),
        },
        Some(b'\\') if pat.len() > 1 => s.first() == Some(&pat[1]) && glob(&pat[2..], &s[1..]),
        Some(&c) => s.first() == Some(&c) && glob(&pat[1..], &s[1..]),
    }
}

/// A character class after its `[`: whether `c` is in it and the bytes it
/// took (its `]` included); None when it has no closing `]`.
fn class(p: &[u8], c: Option<u8>) -> Option<(bool, usize)> {
    let mut i = 0;
    let negated = matches!(p.first(), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let b = *p.get(i)?;
        if b == b']' && !first {
            i += 1;
            break;
        }
        first = false;
        if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&e| e != b']') {
            let e = p[i + 2];
            hit |= c.is_some_and(|c| b <= c && c <= e);
            i += 3;
        } else {
            hit |= c == Some(b);
            i += 1;
        }
    }
    let c = c?;
    Some(((hit != negated) && c != b'/', i))
}

/// The rules of an `--exclude-from` file: one pattern a line (an exclude
/// rule, or an include with a `+ ` prefix; `- ` is an explicit exclude);
/// blank lines and lines starting with `;` or `#` are skipped.
pub fn parse_exclude_from(text: &[u8]) -> Vec<Rule> {
    text.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty() && !l.starts_with(b";") && !l.starts_with(b"#"))
        .map(|l| match l {
            [b'+', b' ', rest @ ..] => Rule {
                action: Action::Include,
                pattern: rest.to_vec(),
            },
            [b'-', b' ', rest @ ..] => Rule {
                action: Action::Exclude,
                pattern: rest.to_vec(),
            },
            _ => Rule {
                action: Action::Exclude,
                pattern: l.to_vec(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(rules: &[(&str, bool)]) -> Filter {
        let rules: Vec<Rule> = rules
            .iter()
            .map(|&(p, include)| Rule {
                action: if include {
                    Action::Include
                } else {
                    Action::Exclude
                },
                pattern: p.as_bytes().to_vec(),
            })
            .collect();
        Filter::new(&rules).unwrap()
    }

    fn out(f: &Filter, path: &str) -> bool {
        f.excludes(path.as_bytes(), false)
    }

    fn out_dir(f: &Filter, path: &str) -> bool {
        f.excludes(path.as_bytes(), true)
    }

    #[test]
    fn a_plain_pattern_matches_the_last_component_at_any_depth() {
        let x = f(&[("*.tmp", false)]);
        assert!(out(&x, "a.tmp") && out(&x, "d/e/b.tmp"));
        assert!(!out(&x, "a.tmpx") && !out(&x, "x.tmp/y"));
        let x = f(&[("core", false)]);
        assert!(out(&x, "core") && out(&x, "a/core") && out_dir(&x, "a/core"));
        assert!(!out(&x, "a/core.1"));
    }

    #[test]
    fn a_slash_anchors_or_spans_components_and_a_trailing_slash_means_a_directory() {
        let x = f(&[("/top", false)]);
        assert!(out(&x, "top") && !out(&x, "a/top"));
        let x = f(&[("a/b", false)]);
        assert!(out(&x, "a/b") && out(&x, "x/a/b") && !out(&x, "xa/b"));
        let x = f(&[("cache/", false)]);
        assert!(out_dir(&x, "cache") && out_dir(&x, "d/cache") && !out(&x, "cache"));
        let x = f(&[("/d/*.o", false)]);
        assert!(out(&x, "d/x.o") && !out(&x, "d/e/x.o") && !out(&x, "e/d/x.o"));
    }

    #[test]
    fn double_stars_cross_slashes_and_triple_stars_take_the_directory_too() {
        let x = f(&[("/a/**/z", false)]);
        assert!(out(&x, "a/b/c/z") && out(&x, "a/b/z") && !out(&x, "b/a/x/z"));
        let x = f(&[("**/z", false)]);
        assert!(out(&x, "a/z") && out(&x, "a/b/z") && !out(&x, "a/zz"));
        let x = f(&[("/keep/***", true), ("*", false)]);
        assert!(!out_dir(&x, "keep") && !out(&x, "keep/a") && !out(&x, "keep/a/b"));
        assert!(out(&x, "other") && out_dir(&x, "x"));
    }

    #[test]
    fn the_first_matching_rule_decides_and_classes_and_escapes_work() {
        let x = f(&[("keep.log", true), ("*.log", false)]);
        assert!(!out(&x, "keep.log") && out(&x, "a.log") && !out(&x, "a.txt"));
        let x = f(&[("file[0-9]", false), ("[!a]x", false), ("q\\*", false)]);
        assert!(out(&x, "file7") && !out(&x, "filex"));
        assert!(out(&x, "bx") && !out(&x, "ax"));
        assert!(out(&x, "q*") && !out(&x, "qq"));
        let x = f(&[("a?c", false)]);
        assert!(out(&x, "abc") && !out(&x, "ac"));
    }

    #[test]
    fn exclude_from_files_take_prefixes_and_skip_comments() {
        let rules = parse_exclude_from(b"# comment\n; also\n\n*.o\n+ keep.o\n- /build/\r\n");
        assert_eq!(
            rules,
            [
                Rule {
                    action: Action::Exclude,
                    pattern: b"*.o".to_vec()
                },
                Rule {
                    action: Action::Include,
                    pattern: b"keep.o".to_vec()
                },
                Rule {
                    action: Action::Exclude,
                    pattern: b"/build/".to_vec()
                },
            ]
        );
        assert!(Filter::new(&[Rule {
            action: Action::Exclude,
            pattern: b"".to_vec()
        }])
        .is_err());
    }
}
