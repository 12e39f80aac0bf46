//! Integers as JSON Schema reads them: `58` and `58.0` are the same
//! integer there, so a request field declared `integer` takes both. serde
//! alone refuses `58.0` for a `u32`; fields that clients fill from a
//! schema deserialize through [`option_u32`] instead. A fraction, a sign
//! or a value past `u32` is still refused, naming the value.

use serde::de::{Deserializer, Error, Unexpected, Visitor};

/// An optional `u32` from a JSON integer or a whole-valued float.
pub fn option_u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    deserializer.deserialize_option(OptionU32)
}

struct OptionU32;

impl<'de> Visitor<'de> for OptionU32 {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a whole number from 0 to 4294967295, or null")
    }

    fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(Some)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(Some)
            .map_err(|_| E::invalid_value(Unexpected::Signed(value), &self))
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<Self::Value, E> {
        let whole = value.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&value);
        if whole {
            // In range and without a fraction: the cast is exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Ok(Some(value as u32))
        } else {
            Err(E::invalid_value(Unexpected::Float(value), &self))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug, PartialEq)]
    struct Body {
        #[serde(default, deserialize_with = "super::option_u32")]
        n: Option<u32>,
    }

    fn parse(json: &str) -> Result<Option<u32>, String> {
        serde_json::from_str::<Body>(json)
            .map(|b| b.n)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn whole_floats_are_integers_and_the_rest_is_refused_by_value() {
        assert_eq!(parse(r#"{"n": 58}"#), Ok(Some(58)));
        assert_eq!(parse(r#"{"n": 58.0}"#), Ok(Some(58)));
        assert_eq!(parse(r#"{"n": 4294967295.0}"#), Ok(Some(u32::MAX)));
        assert_eq!(parse(r#"{"n": null}"#), Ok(None));
        assert_eq!(parse("{}"), Ok(None));
        for (json, shown) in [
            (r#"{"n": 58.5}"#, "58.5"),
            (r#"{"n": -1}"#, "-1"),
            (r#"{"n": 4294967296}"#, "4294967296"),
            (r#"{"n": 1e300}"#, "1e+300"),
            (r#"{"n": "5"}"#, "\"5\""),
        ] {
            let error = parse(json).unwrap_err();
            assert!(error.contains(shown), "{json}: {error}");
        }
    }
}
