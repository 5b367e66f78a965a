//! Hostile input for the decoders' tests: random strings and mutations of valid samples
//! (truncation, deletion, duplication, inserted markup, quotes, line breaks, control characters,
//! non-ASCII text, 64 KiB runs), from a fixed seed so a failure repeats. `BANLIEUE_HOSTILE_CASES`
//! sets how many cases a test runs (default 2,000; a long campaign: 200000).
//! Shared by test binaries (`#[path]`-included).

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const PIECES: [&str; 40] = [
    "<",
    ">",
    "</",
    "/>",
    "&",
    "&amp;",
    "&#",
    "&#x",
    ";",
    "\"",
    "'",
    "=",
    ":",
    ",",
    "/",
    "\\",
    " ",
    "\n",
    "\r",
    "\t",
    "\0",
    "\u{7f}",
    "\u{85}",
    "\u{2028}",
    "é",
    "日本",
    "🦀",
    "0",
    "9",
    "-1",
    "4294967296",
    "18446744073709551616",
    "G",
    "T",
    "K",
    "x",
    "A",
    "<![CDATA[",
    "]]>",
    "<!--",
];

/// A source of hostile input.
pub struct Hostile(ChaCha8Rng);

impl Hostile {
    /// From `seed` (one per test, so each fails the same way every run).
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// How many cases a test runs.
    pub fn cases() -> usize {
        std::env::var("BANLIEUE_HOSTILE_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2_000)
    }

    fn piece(&mut self) -> String {
        match self.0.random_range(0..20) {
            0 => char::from_u32(self.0.random_range(0..0x3_0000))
                .unwrap_or('?')
                .to_string(),
            1 => "A".repeat(self.0.random_range(1..64 * 1024)),
            _ => PIECES[self.0.random_range(0..PIECES.len())].to_owned(),
        }
    }

    /// A random string of pieces.
    pub fn string(&mut self) -> String {
        (0..self.0.random_range(0..12)).map(|_| self.piece()).collect()
    }

    /// `valid` with one to four random edits (at character boundaries).
    pub fn mutate(&mut self, valid: &str) -> String {
        let mut s: Vec<char> = valid.chars().collect();
        for _ in 0..self.0.random_range(1..5) {
            let at = self.0.random_range(0..=s.len());
            match self.0.random_range(0..5) {
                0 => s.truncate(at),
                1 if at < s.len() => {
                    let end = self.0.random_range(at..=s.len());
                    s.drain(at..end);
                }
                2 if at < s.len() => {
                    let end = self.0.random_range(at..=s.len().min(at + 64));
                    let copy: Vec<char> = s[at..end].to_vec();
                    s.splice(at..at, copy);
                }
                _ => {
                    let piece = self.piece();
                    s.splice(at..at, piece.chars());
                }
            }
        }
        s.into_iter().collect()
    }

    /// `valid` with random bytes flipped, a run overwritten or the end cut off.
    pub fn mutate_bytes(&mut self, valid: &[u8]) -> Vec<u8> {
        let mut b = valid.to_vec();
        for _ in 0..self.0.random_range(1..9) {
            if b.is_empty() {
                break;
            }
            let at = self.0.random_range(0..b.len());
            match self.0.random_range(0..4) {
                0 => b.truncate(at),
                1 => b[at] ^= 1 << self.0.random_range(0..8),
                2 => b[at] = [0, 0xff, 0x7f, 0x80][self.0.random_range(0..4)],
                _ => {
                    let end = (at + self.0.random_range(1..16)).min(b.len());
                    for byte in &mut b[at..end] {
                        *byte = self.0.random();
                    }
                }
            }
        }
        b
    }

    /// One of `samples`, mutated, or a random string.
    pub fn input(&mut self, samples: &[&str]) -> String {
        if samples.is_empty() || self.0.random_range(0..4) == 0 {
            self.string()
        } else {
            let sample = samples[self.0.random_range(0..samples.len())];
            self.mutate(sample)
        }
    }
}
