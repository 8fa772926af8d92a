//! blocks: a value off the path followed through 64 bytes at a time, the way simdjson's first
//! stage finds a text's structure: each block's quotes, backslashes and brackets become bit masks
//! (SSE2 compares on x86_64, AVX2 where the processor has it, chosen when the program runs; a
//! byte loop elsewhere), the bytes inside strings a mask made by a prefix XOR of the quotes,
//! and a block whose closing brackets cannot end the value is passed with three population
//! counts. Byte by byte, as [`super::json`] otherwise follows such a value, a JSON answer's nested
//! objects and long strings (an LLM's text, full of `\n`) took about 2.3 instructions a byte.
//!
//! Exactly the byte-by-byte rules: a string ends at its first quote not escaped by a backslash
//! (a backslash escapes the byte after it, a backslash too), brackets count outside strings only,
//! and a backslash outside a string (never in JSON) is a byte like any other. A block with such a
//! backslash is left to the caller, whose byte-by-byte reading gives it the same meaning.

/// Where a block's bytes of interest are: bit `i` for its byte `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Masks {
    quote: u64,
    backslash: u64,
    /// `{` and `[`.
    open: u64,
    /// `}` and `]`.
    close: u64,
}

/// The masks of a block, byte by byte: what the vector versions must find (and the version
/// where there is none).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn masks_bytes(block: &[u8; 64]) -> Masks {
    let mut m = Masks {
        quote: 0,
        backslash: 0,
        open: 0,
        close: 0,
    };
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'{' | b'[' => m.open |= bit,
            b'}' | b']' => m.close |= bit,
            _ => {}
        }
    }
    m
}

/// Bit `i` set where an odd number of bits `0..=i` of `x` are.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Masks;

    // `{` and `[` differ in bit 5 alone (0x7B, 0x5B), as do `}` and `]` (0x7D, 0x5D): with it
    // set, one compare finds both.

    /// SSE2, which every x86_64 CPU has: 16 bytes a compare.
    #[inline(always)]
    pub fn masks_sse2(block: &[u8; 64]) -> Masks {
        let mut m = Masks {
            quote: 0,
            backslash: 0,
            open: 0,
            close: 0,
        };
        for k in 0..4 {
            // SAFETY: SSE2 is part of every x86_64 CPU (the intrinsics need no more), and the
            // 16 bytes read are in `block` (`loadu`: no alignment needed).
            unsafe {
                let v = _mm_loadu_si128(block.as_ptr().add(16 * k).cast::<__m128i>());
                let bits = |c: u8, v: __m128i| {
                    (_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8))) as u16 as u64)
                        << (16 * k)
                };
                let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
                m.quote |= bits(b'"', v);
                m.backslash |= bits(b'\\', v);
                m.open |= bits(b'{', folded);
                m.close |= bits(b'}', folded);
            }
        }
        m
    }

    /// AVX2: 32 bytes a compare. Only where the CPU has it (checked by the caller).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub fn masks_avx2(block: &[u8; 64]) -> Masks {
        let mut m = Masks {
            quote: 0,
            backslash: 0,
            open: 0,
            close: 0,
        };
        for k in 0..2 {
            // SAFETY: the 32 bytes read are in `block` (`loadu`: no alignment needed).
            let v = unsafe { _mm256_loadu_si256(block.as_ptr().add(32 * k).cast::<__m256i>()) };
            let bits = |c: u8, v: __m256i| {
                (_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(c as i8))) as u32
                    as u64)
                    << (32 * k)
            };
            let folded = _mm256_or_si256(v, _mm256_set1_epi8(0x20));
            m.quote |= bits(b'"', v);
            m.backslash |= bits(b'\\', v);
            m.open |= bits(b'{', folded);
            m.close |= bits(b'}', folded);
        }
        m
    }

    /// [`super::prefix_xor`] in one carry-less multiplication by all ones.
    #[target_feature(enable = "pclmulqdq")]
    #[inline]
    pub fn prefix_xor_clmul(x: u64) -> u64 {
        let product = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
        _mm_cvtsi128_si64(product) as u64
    }
}

/// Where a value off the path is, between blocks: the brackets open in it (0 for a string alone),
/// whether a string is open, and whether the next byte is escaped (after a `\` in a string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skipping {
    pub open: u64,
    pub in_string: bool,
    pub escaped: bool,
}

/// Follows the value from `bytes[i]` through whole blocks of 64 bytes: `Ok(end)` when it ends
/// (`end` is past its closing bracket or quote), `Err(i)` with `at` updated where the caller
/// goes on byte by byte: fewer than 64 bytes left, or a block with a backslash outside a string.
pub fn skip(bytes: &[u8], i: usize, at: &mut Skipping) -> Result<usize, usize> {
    #[cfg(target_arch = "x86_64")]
    {
        // std caches what the CPU has: a load and a test.
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("popcnt")
            && std::is_x86_feature_detected!("pclmulqdq")
        {
            // SAFETY: the CPU has the features `skip_avx2` is compiled for (checked above).
            return unsafe { skip_avx2(bytes, i, at) };
        }
        skip_with(bytes, i, at, x86::masks_sse2, prefix_xor)
    }
    #[cfg(not(target_arch = "x86_64"))]
    skip_with(bytes, i, at, masks_bytes, prefix_xor)
}

/// [`skip`] compiled for AVX2, `popcnt` (the counts of brackets: a dozen instructions each
/// without it) and `pclmulqdq` (the prefix XOR).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt,pclmulqdq")]
fn skip_avx2(bytes: &[u8], i: usize, at: &mut Skipping) -> Result<usize, usize> {
    skip_with(
        bytes,
        i,
        at,
        |b| x86::masks_avx2(b),
        |x| x86::prefix_xor_clmul(x),
    )
}

/// [`skip`], with the CPU's way of finding a block's masks and of a prefix XOR.
#[inline(always)]
fn skip_with(
    bytes: &[u8],
    mut i: usize,
    at: &mut Skipping,
    masks: impl Fn(&[u8; 64]) -> Masks,
    prefix_xor: impl Fn(u64) -> u64,
) -> Result<usize, usize> {
    while let Some(block) = bytes.get(i..i + 64) {
        let block: &[u8; 64] = block.try_into().unwrap_or(&[0; 64]);
        let m = masks(block);
        // The bytes a backslash escapes, and whether it escapes the next block's first.
        let mut escaped = u64::from(at.escaped);
        let mut escaped_next = false;
        let mut escapes = m.backslash & !escaped;
        while escapes != 0 {
            let b = escapes.trailing_zeros();
            match b {
                63 => escaped_next = true,
                _ => escaped |= 1 << (b + 1),
            }
            // The byte escaped is not an escape itself.
            escapes &= !(1 << b) & !escaped;
        }
        let quotes = m.quote & !escaped;
        // Inside a string: from its opening quote up to, not with, its closing one.
        let inside = prefix_xor(quotes) ^ if at.in_string { u64::MAX } else { 0 };
        // The escapes read above are right only if every backslash is in a string.
        if m.backslash & !inside != 0 {
            return Err(i);
        }
        if at.open == 0 {
            // A string alone: it ends at its closing quote.
            if quotes != 0 {
                return Ok(i + quotes.trailing_zeros() as usize + 1);
            }
        } else {
            let (open, close) = (m.open & !inside, m.close & !inside);
            if u64::from(close.count_ones()) >= at.open {
                // The value may end here: its brackets one by one.
                let mut brackets = open | close;
                while brackets != 0 {
                    let b = brackets.trailing_zeros();
                    brackets &= brackets - 1;
                    if open & (1 << b) != 0 {
                        at.open += 1;
                    } else {
                        at.open -= 1;
                        if at.open == 0 {
                            return Ok(i + b as usize + 1);
                        }
                    }
                }
            } else {
                at.open = at.open + u64::from(open.count_ones()) - u64::from(close.count_ones());
            }
        }
        at.in_string = inside >> 63 == 1;
        at.escaped = escaped_next;
        i += 64;
    }
    Err(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's masks, the same by every version this CPU has.
    fn masks(block: &[u8; 64]) -> Masks {
        let want = masks_bytes(block);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(x86::masks_sse2(block), want);
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked above).
                assert_eq!(unsafe { x86::masks_avx2(block) }, want);
            }
        }
        want
    }

    /// [`skip`] by each version this CPU has, which must agree.
    fn skip(bytes: &[u8], i: usize, at: &mut Skipping) -> Result<usize, usize> {
        let mut portable = *at;
        let want = skip_with(bytes, i, &mut portable, masks_bytes, prefix_xor);
        let got = super::skip(bytes, i, at);
        assert_eq!((got, *at), (want, portable));
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("pclmulqdq") {
            for x in [
                0,
                1,
                0x8000_0000_0000_0001,
                (bytes.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ] {
                // SAFETY: the CPU has pclmulqdq (checked above).
                assert_eq!(unsafe { x86::prefix_xor_clmul(x) }, prefix_xor(x));
            }
        }
        got
    }

    /// The byte-by-byte rules, as `json::Scan::skip` reads them: the model.
    fn model(bytes: &[u8], mut i: usize, at: &mut Skipping) -> Option<usize> {
        while let Some(&b) = bytes.get(i) {
            i += 1;
            if at.in_string {
                match (at.escaped, b) {
                    (true, _) => at.escaped = false,
                    (false, b'\\') => at.escaped = true,
                    (false, b'"') => {
                        at.in_string = false;
                        if at.open == 0 {
                            return Some(i);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => at.in_string = true,
                b'{' | b'[' => at.open += 1,
                b'}' | b']' => {
                    at.open -= 1;
                    if at.open == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Blocks as far as they go, the model after.
    fn blocks_then_model(bytes: &[u8], at: &mut Skipping) -> Option<usize> {
        match skip(bytes, 0, at) {
            Ok(end) => Some(end),
            Err(i) => model(bytes, i, at),
        }
    }

    #[test]
    fn masks_find_each_byte() {
        let mut block = [b'a'; 64];
        block[0] = b'"';
        block[17] = b'\\';
        block[33] = b'[';
        block[40] = b'{';
        block[63] = b']';
        block[48] = b'}';
        assert_eq!(
            masks(&block),
            Masks {
                quote: 1,
                backslash: 1 << 17,
                open: (1 << 33) | (1 << 40),
                close: (1 << 63) | (1 << 48),
            }
        );
        // Every other byte: none.
        for b in 0..=255u8 {
            if !b"\"\\{}[]".contains(&b) {
                assert_eq!(masks(&[b; 64]), masks(&[b'a'; 64]), "{b}");
            }
        }
    }

    #[test]
    fn a_value_ends_where_byte_by_byte_it_ends() {
        // Texts of the bytes that matter, with runs of backslashes across block edges.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut ended, mut fell_back) = (0, 0);
        for n in 0..50_000 {
            let len = 64 + (next() % 300) as usize;
            // Mostly text, as JSON is; some texts all backslashes and quotes.
            let alphabet: &[u8] = match n % 4 {
                0 => b"\"\\\\\\{}[]a",
                _ => b"\"\\{}[]aaaaaaaaaaaaaaaaaaaaaa:, ",
            };
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let start = Skipping {
                open: next() % 3,
                in_string: true,
                escaped: next() % 5 == 0,
            };
            let start = match start.open {
                0 => start,
                _ => Skipping {
                    in_string: next() % 2 == 0,
                    ..start
                },
            };
            let start = Skipping {
                escaped: start.escaped && start.in_string,
                ..start
            };
            let (mut a, mut b) = (start, start);
            let want = model(&bytes, 0, &mut a);
            let got = blocks_then_model(&bytes, &mut b);
            assert_eq!(
                got,
                want,
                "{:?} from {start:?}",
                String::from_utf8_lossy(&bytes)
            );
            if want.is_none() {
                assert_eq!(b, a, "{:?}", String::from_utf8_lossy(&bytes));
            }
            ended += usize::from(want.is_some());
            fell_back += usize::from(matches!(skip(&bytes, 0, &mut start.clone()), Err(0)));
        }
        assert!(
            ended > 10_000 && fell_back > 1_000,
            "{ended} ended, {fell_back} fell back"
        );
    }

    #[test]
    fn a_long_string_and_deep_brackets_pass_in_blocks() {
        let string = format!("\"{}\\\"{}\"", "x".repeat(100), "\\n".repeat(100));
        let text = format!("{string}{}", " ".repeat(64));
        let mut at = Skipping {
            open: 0,
            in_string: true,
            escaped: false,
        };
        assert_eq!(skip(text.as_bytes(), 1, &mut at), Ok(string.len()));
        // Fewer than 64 bytes left: the caller's.
        let mut at = Skipping {
            open: 0,
            in_string: true,
            escaped: false,
        };
        assert_eq!(skip(string.as_bytes(), 1, &mut at), Err(257));
        let text = format!("{}{}{}", "[".repeat(300), "]".repeat(300), " ".repeat(64));
        let mut at = Skipping {
            open: 1,
            in_string: false,
            escaped: false,
        };
        assert_eq!(skip(text.as_bytes(), 1, &mut at), Ok(600));
    }
}
