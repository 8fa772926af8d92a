//! ascii: whether a short string holds a byte of a kind, eight bytes at a time.
//!
//! Every request asks this of its path (an upper-case letter?) and of its endpoint's name (a
//! character a Structured Fields string escapes?); a loop over the bytes spends about six
//! instructions a byte there, a word at a time about one (callgrind, docs/benchmarks/).
//!
//! Pure: no I/O; unit tests below check every byte against the plain definition.

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Non-zero exactly when a byte of `w` is `b` (the classic "has a zero byte" test on `w ^ b…`;
/// which bits are set may be wrong above a match, whether any is never is).
#[inline(always)]
const fn has_byte(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * b as u64);
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The high bit of each byte of `w` that is an ASCII upper-case letter. No carry crosses a byte:
/// the sums are taken of the bytes' low seven bits.
#[inline(always)]
const fn upper_bytes(w: u64) -> u64 {
    let low = w & !HIGHS;
    let from_a = low + ONES * (0x80 - b'A' as u64);
    let past_z = low + ONES * (0x80 - b'Z' as u64 - 1);
    from_a & !past_z & !w & HIGHS
}

/// Whether `test` finds something in a word of `s`: whole words, then the last eight bytes
/// (again in part), or byte by byte when `s` is shorter than a word. `test` must find nothing in
/// zero bytes.
#[inline(always)]
fn any_word(s: &[u8], test: impl Fn(u64) -> u64) -> bool {
    let (words, rest) = s.as_chunks::<8>();
    if words.iter().any(|w| test(u64::from_le_bytes(*w)) != 0) {
        return true;
    }
    match s.last_chunk::<8>() {
        Some(last) if !rest.is_empty() => test(u64::from_le_bytes(*last)) != 0,
        Some(_) => false,
        None => rest.iter().any(|&b| test(u64::from(b)) != 0),
    }
}

/// Whether `s` has an ASCII upper-case letter (`A` to `Z`).
pub fn has_upper(s: &[u8]) -> bool {
    any_word(s, upper_bytes)
}

/// Whether `s` has a byte that is `a` or `b` (neither zero).
pub fn has_either(s: &[u8], a: u8, b: u8) -> bool {
    debug_assert!(a != 0 && b != 0);
    any_word(s, |w| has_byte(w, a) | has_byte(w, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each byte value at each place of strings of every length up to 20, in a filler that is
    /// none of the kinds: each test agrees with the definition.
    #[test]
    fn every_byte_at_every_place_agrees_with_the_definition() {
        for len in 0..=20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    for filler in [b'a', 0x00, 0xff, b'@', b'['] {
                        let mut s = vec![filler; len];
                        s[at] = b;
                        let upper = s.iter().any(u8::is_ascii_uppercase);
                        assert_eq!(has_upper(&s), upper, "{s:?}");
                        let quote = s.iter().any(|&c| c == b'"' || c == b'\\');
                        assert_eq!(has_either(&s, b'"', b'\\'), quote, "{s:?}");
                    }
                }
            }
        }
        assert!(!has_upper(b""));
        assert!(!has_either(b"", b'"', b'\\'));
    }

    #[test]
    fn several_matches_and_neighbours_of_the_range() {
        assert!(has_upper(b"/users/42/Prefs/xxxxxxxxxxxZ"));
        assert!(!has_upper(b"/users/@[`{/xxxxxxx\x7f\x80\xc1\xda"));
        assert!(has_either(b"GET /a\\\"b", b'"', b'\\'));
        assert!(!has_either(
            b"GET /users/{id}/prefs!#$%&'()*+,-./",
            b'"',
            b'\\'
        ));
    }
}
