//! Whatever string the seed writer is given, cloud-init's own YAML loader (PyYAML, YAML 1.1, from
//! Debian's cloud-init package: `tests/cloud-init/support.rs`) reads back the same string, as
//! key and as value: random strings from a fixed seed mixing YAML indicators, words and numbers
//! YAML 1.1 retypes, whitespace and line breaks, control characters and non-ASCII text.
//! `BANLIEUE_YAML11_CASES` sets how many (default 3,000; a long campaign: 200000).

#[path = "../../../tests/cloud-init/support.rs"]
mod cloud_init;

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use banlieue_cloudinit::yaml11;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const WORDS: [&str; 24] = [
    "yes",
    "No",
    "ON",
    "off",
    "y",
    "n",
    "true",
    "False",
    "null",
    "~",
    ".inf",
    "-.Inf",
    ".NaN",
    "0x1f",
    "0o17",
    "0b101",
    "1_000",
    "012",
    "1e3",
    "2024-01-01",
    "2001-12-14t21:59:43.10-05:00",
    "12:30:45",
    "=",
    "<<",
];
const PIECES: [&str; 30] = [
    "a", "Z", "0", "9", ":", "-", ".", "_", " ", "#", "&", "*", "!", "|", ">", "'", "\"", "%", "@", "`", ",",
    "[", "]", "{", "}", "?", "\\", "é", "日本", "🦀",
];
const ODD: [char; 14] = [
    '\n', '\t', '\r', '\0', '\u{7}', '\u{1b}', '\u{7f}', '\u{85}', '\u{a0}', '\u{2028}', '\u{2029}',
    '\u{feff}', '\u{fffe}', '\u{ffff}',
];

fn random_string(rng: &mut ChaCha8Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.random_range(0..6) {
        match rng.random_range(0..10) {
            0 => s.push_str(WORDS[rng.random_range(0..WORDS.len())]),
            1 => s.push(ODD[rng.random_range(0..ODD.len())]),
            2 => s.push(char::from_u32(rng.random_range(0x20..0x3000)).unwrap_or('?')),
            _ => s.push_str(PIECES[rng.random_range(0..PIECES.len())]),
        }
    }
    s
}

fn cases() -> usize {
    std::env::var("BANLIEUE_YAML11_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3_000)
}

/// The first entry of `want` that cloud-init's loader read differently, for the failure message.
fn first_difference(want: &serde_json::Value, got: &serde_json::Value) -> String {
    match (want.as_object(), got.as_object()) {
        (Some(w), Some(g)) => w
            .iter()
            .find(|(k, v)| g.get(*k) != Some(v))
            .map(|(k, v)| format!("{k:?}: wrote {v:?}, read {:?}", g.get(k)))
            .unwrap_or_else(|| format!("keys differ: {} written, {} read", w.len(), g.len())),
        _ => format!("read {got:?}"),
    }
}

#[test]
fn any_string_reads_back_the_same_in_cloud_inits_yaml_loader() -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_ba41);
    let n = cases();
    let values: BTreeMap<String, String> = (0..n)
        .map(|i| (format!("k{i}"), random_string(&mut rng)))
        .collect();
    let keys: BTreeMap<String, usize> = (0..n)
        .map(|i| (format!("{}#{i}", random_string(&mut rng)), i))
        .collect();
    for (what, written) in [
        ("values", serde_json::to_value(&values)?),
        ("keys", serde_json::to_value(&keys)?),
    ] {
        let text = yaml11::to_string(&written)?;
        let read = cloud_init::load_yaml(&text)?;
        ensure!(read == written, "{what}: {}", first_difference(&written, &read));
        let read_1_2: serde_json::Value = serde_yaml::from_str(&text)?;
        ensure!(
            read_1_2 == written,
            "{what} (YAML 1.2): {}",
            first_difference(&written, &read_1_2)
        );
    }
    Ok(())
}
