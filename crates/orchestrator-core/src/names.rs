//! One place for the enums that have a name per variant (statuses,
//! priorities, backends): the list of all variants, `as_str`, `Display`,
//! and a `FromStr` whose error lists what would have been accepted.

/// `named_variants!(Type, "what it is", [Variant => "name", ...])`.
#[macro_export]
macro_rules! named_variants {
    ($ty:ident, $what:literal, [$($variant:ident => $name:literal),+ $(,)?]) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                $ty::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let known: Vec<&str> = $ty::ALL.iter().map(|v| v.as_str()).collect();
                    format!("unknown {} `{s}` (expected one of {})", $what, known.join(", "))
                })
            }
        }
    };
}
