//! Printing text that other processes chose.
//!
//! A process picks its own command name (`PR_SET_NAME`) and the names of
//! the files it maps, so both can hold terminal escape sequences, bell
//! characters, line breaks or bidirectional overrides. Printed raw into
//! root's terminal (the status table, the scan report, the logs) they
//! could rewrite the screen or fake lines. [`printable`] is the one place
//! that makes such text safe to print: every character a terminal would
//! act on instead of show is written as an escape, and the backslash is
//! doubled so that an escape cannot be faked.

use std::borrow::Cow;

/// Characters that are invisible but reorder or hide text (zero-width
/// characters, bidirectional embeddings, overrides and isolates, the byte
/// order mark): not controls, yet they change what a line appears to say.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// `s` with every control character (below 0x20, 0x7f, the C1 range
/// 0x80–0x9f), every invisible formatting character and the backslash
/// escaped (`\x1b`, `\u{202e}`, `\\`); borrowed when nothing needed it.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s
        .chars()
        .any(|c| c == '\\' || c.is_control() || invisible(c))
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x100 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() || invisible(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn controls_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(printable("qemu-system-x86"), Cow::Borrowed(_)));
        assert!(matches!(
            printable("/usr/lib/libc.so.6 (deleted)"),
            Cow::Borrowed(_)
        ));
        assert_eq!(printable("a\x1b[31mb"), "a\\x1b[31mb");
        assert_eq!(printable("bell\x07\n\r\t"), "bell\\x07\\x0a\\x0d\\x09");
        assert_eq!(printable("del\x7f"), "del\\x7f");
        assert_eq!(printable("c1\u{9b}"), "c1\\x9b");
        assert_eq!(printable("evil\u{202e}gpj.exe"), "evil\\u{202e}gpj.exe");
        assert_eq!(
            printable("a\\x1b"),
            "a\\\\x1b",
            "a literal escape is not faked"
        );
        assert_eq!(printable("Grüße"), "Grüße");
    }

    proptest! {
        /// Nothing a terminal acts on survives, and the escaping can be
        /// undone (it is unambiguous).
        #[test]
        fn output_is_printable_and_unambiguous(s in "\\PC*|[\\x00-\\x7f\u{80}-\u{ff}\u{202a}-\u{202e}\\\\]*") {
            let p = printable(&s);
            prop_assert!(p.chars().all(|c| !c.is_control() && !invisible(c)));
            prop_assert_eq!(unescape(&p), s);
        }
    }

    fn unescape(s: &str) -> String {
        let mut out = String::new();
        let mut it = s.chars().peekable();
        while let Some(c) = it.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match it.next() {
                Some('\\') => out.push('\\'),
                Some('x') => {
                    let h: String = it.by_ref().take(2).collect();
                    out.push(char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap());
                }
                Some('u') => {
                    it.next(); // {
                    let h: String = it.by_ref().take_while(|&c| c != '}').collect();
                    out.push(char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap());
                }
                other => panic!("bad escape {other:?}"),
            }
        }
        out
    }
}
