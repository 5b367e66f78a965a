//! Tolerant deserialisers for what PVE really sends (Perl-typed values, see `WIRE.md`):
//! numbers as strings (`"100"`, `memory: "2048"`), booleans as `0`/`1` (or `"0"`/`"1"`, or JSON
//! booleans). Use them with `#[serde(deserialize_with = "…")]`; the `opt_*` variants also need
//! `#[serde(default)]`.

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::Value;

fn value_to_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn value_to_u64(v: &Value) -> Option<u64> {
    value_to_i64(v)
        .and_then(|i| u64::try_from(i).ok())
        .or_else(|| match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        })
}

fn value_to_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn value_to_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_i64() {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.trim() {
            "0" | "false" => Some(false),
            "1" | "true" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

fn value_to_string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(u8::from(b).to_string()),
        _ => None,
    }
}

fn optional<'de, D, T>(
    d: D,
    what: &str,
    conv: impl FnOnce(&Value) -> Option<T>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v) => conv(&v)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected {what}, got {v}"))),
    }
}

fn required<'de, D, T>(d: D, what: &str, conv: impl FnOnce(&Value) -> Option<T>) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    optional(d, what, conv)?.ok_or_else(|| D::Error::custom(format!("expected {what}, got null")))
}

/// An integer sent as a number or a string.
pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    required(d, "an integer", value_to_i64)
}

/// An optional integer sent as a number or a string.
pub fn opt_int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional(d, "an integer", value_to_i64)
}

/// A non-negative integer sent as a number or a string.
pub fn uint<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    required(d, "a non-negative integer", value_to_u64)
}

/// An optional non-negative integer sent as a number or a string.
pub fn opt_uint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    optional(d, "a non-negative integer", value_to_u64)
}

/// A VMID (`u32`) sent as a number or a string.
pub fn vmid<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    required(d, "a VMID", |v| {
        value_to_u64(v).and_then(|n| u32::try_from(n).ok())
    })
}

/// An optional VMID (`u32`) sent as a number or a string.
pub fn opt_vmid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    optional(d, "a VMID", |v| {
        value_to_u64(v).and_then(|n| u32::try_from(n).ok())
    })
}

/// An optional floating-point number sent as a number or a string.
pub fn opt_float<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    optional(d, "a number", value_to_f64)
}

/// A boolean sent as `0`/`1`, `"0"`/`"1"` or `true`/`false`; absent or null is `false`.
pub fn bool01<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(optional(d, "a boolean (0/1)", value_to_bool)?.unwrap_or(false))
}

/// An optional boolean sent as `0`/`1`, `"0"`/`"1"` or `true`/`false`.
pub fn opt_bool01<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    optional(d, "a boolean (0/1)", value_to_bool)
}

/// An optional string that PVE may send as a number (e.g. `memory`).
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let shown = v.to_string();
            value_to_string(v)
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("expected a string, got {shown}")))
        }
    }
}

/// Converts a scalar JSON value to the string PVE would print for it (`1` for true, numbers as is).
pub fn scalar_to_string(v: Value) -> Option<String> {
    value_to_string(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct T {
        #[serde(deserialize_with = "int")]
        i: i64,
        #[serde(default, deserialize_with = "opt_uint")]
        u: Option<u64>,
        #[serde(default, deserialize_with = "bool01")]
        b: bool,
        #[serde(default, deserialize_with = "opt_bool01")]
        ob: Option<bool>,
        #[serde(default, deserialize_with = "opt_string")]
        s: Option<String>,
        #[serde(default, deserialize_with = "opt_float")]
        f: Option<f64>,
    }

    #[rstest]
    #[case(r#"{"i":100}"#, 100)]
    #[case(r#"{"i":"100"}"#, 100)]
    #[case(r#"{"i":" 7 "}"#, 7)]
    #[case(r#"{"i":-3}"#, -3)]
    #[case(r#"{"i":4.0}"#, 4)]
    fn integers_from_numbers_or_strings(#[case] json: &str, #[case] want: i64) {
        let t: T = serde_json::from_str(json).unwrap();
        assert_eq!(t.i, want);
    }

    #[rstest]
    #[case(r#"{"i":"abc"}"#)]
    #[case(r#"{"i":1.5}"#)]
    #[case(r#"{"i":null}"#)]
    #[case(r#"{"i":[1]}"#)]
    #[case(r#"{"i":1,"b":2}"#)]
    #[case(r#"{"i":1,"b":"yes"}"#)]
    #[case(r#"{"i":1,"u":-1}"#)]
    fn rejects_what_is_not_a_number_or_boolean(#[case] json: &str) {
        assert!(
            serde_json::from_str::<T>(json).is_err(),
            "{json} should be rejected"
        );
    }

    #[rstest]
    #[case(r#"{"i":0,"b":1,"ob":0}"#, true, Some(false))]
    #[case(r#"{"i":0,"b":"1","ob":"1"}"#, true, Some(true))]
    #[case(r#"{"i":0,"b":true,"ob":false}"#, true, Some(false))]
    #[case(r#"{"i":0,"b":0}"#, false, None)]
    #[case(r#"{"i":0}"#, false, None)]
    #[case(r#"{"i":0,"b":null,"ob":null}"#, false, None)]
    fn booleans_from_0_1(#[case] json: &str, #[case] b: bool, #[case] ob: Option<bool>) {
        let t: T = serde_json::from_str(json).unwrap();
        assert_eq!((t.b, t.ob), (b, ob));
    }

    #[test]
    fn strings_and_floats_from_either_form() {
        let t: T = serde_json::from_str(r#"{"i":0,"s":2048,"f":"0.25","u":"8"}"#).unwrap();
        assert_eq!(t.s.as_deref(), Some("2048"));
        assert_eq!(t.f, Some(0.25));
        assert_eq!(t.u, Some(8));
        let t: T = serde_json::from_str(r#"{"i":0,"s":"4096","f":1}"#).unwrap();
        assert_eq!(t.s.as_deref(), Some("4096"));
        assert_eq!(t.f, Some(1.0));
    }
}
