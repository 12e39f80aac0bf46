//! `Keep`: how long something is kept after it ends, as the service's
//! retention settings and a workflow's `meta.retain` say it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How long something is kept after it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Forever,
    For(Duration),
}

/// Longest period kept as a period (a longer one means forever): far
/// beyond any real need, and safe to subtract from any clock reading
/// chrono can hold.
const MAX_KEEP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What parses as a `Keep`, for the API's schema: `forever`, or numbers
/// each with a unit, as `humantime` reads them (`30d`, `1h 30m`). Only
/// the schema (the `openapi` feature) and the tests read it.
#[cfg_attr(not(any(feature = "openapi", test)), allow(dead_code))]
pub const KEEP_PATTERN: &str = "^(forever|[0-9]{1,6}(nsec|ns|usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y)( [0-9]{1,6}(nsec|ns|usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y))*)$";

impl FromStr for Keep {
    type Err = String;

    /// `forever`, or a period such as `30d`, `12h`, `90days`, `1h 30m`.
    fn from_str(s: &str) -> Result<Keep, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("forever") {
            return Ok(Keep::Forever);
        }
        let period = humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a period: {e} (write e.g. 30d, 12h, or forever)"))?;
        // Past a century nothing ends before it: keep for good.
        if period > MAX_KEEP {
            return Ok(Keep::Forever);
        }
        Ok(Keep::For(period))
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::Forever => f.write_str("forever"),
            Keep::For(period) => write!(f, "{}", humantime::format_duration(*period)),
        }
    }
}

impl Serialize for Keep {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Keep, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// On the wire a period is a string: `forever`, or `30d`, `12h`, ...
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Keep {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .description(Some(
                "`forever`, or a period such as `30d`, `12h`, `90days`, `1h 30m`",
            ))
            .examples(["30d"])
            .pattern(Some(KEEP_PATTERN))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Keep {}

impl Keep {
    /// Whether something that ended at `ended` is past keeping at `now`.
    pub fn expired(self, ended: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        match self {
            Keep::Forever => false,
            Keep::For(period) => chrono::Duration::from_std(period)
                .ok()
                .and_then(|period| ended.checked_add_signed(period))
                .is_some_and(|until| until <= now),
        }
    }

    /// The moment before which anything that ended is past keeping.
    pub fn cutoff(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Keep::Forever => None,
            Keep::For(period) => chrono::Duration::from_std(period)
                .ok()
                .and_then(|period| now.checked_sub_signed(period)),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The API's schema promises that every string of its pattern is
        /// accepted: the parser must agree (the contract test holds the
        /// service to it).
        #[test]
        fn every_period_the_schema_allows_parses(
            text in proptest::string::string_regex(
                KEEP_PATTERN.trim_start_matches('^').trim_end_matches('$')
            ).unwrap()
        ) {
            prop_assert!(text.parse::<Keep>().is_ok(), "{text:?}");
        }
    }
}
