//! Whether this process holds the capabilities namespaces need, read from
//! `/proc/self/status` before anything is made.

/// `CAP_NET_ADMIN`'s bit in the capability sets.
const CAP_NET_ADMIN: u32 = 12;
/// `CAP_SYS_ADMIN`'s bit.
const CAP_SYS_ADMIN: u32 = 21;

/// The capabilities test environments need that this process's effective
/// set lacks (empty when it has them all).
pub fn missing() -> Vec<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    missing_in(&status)
}

/// [`missing`], from the text of a `/proc/<pid>/status`.
pub fn missing_in(status: &str) -> Vec<&'static str> {
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| effective & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::missing_in;

    #[test]
    fn root_has_both() {
        assert!(missing_in("Name:\tx\nCapEff:\t000001fffeffffff\n").is_empty());
    }

    #[test]
    fn each_missing_capability_is_named() {
        // Everything but CAP_NET_ADMIN (bit 12).
        assert_eq!(missing_in("CapEff:\t000001ffffffefff\n"), ["CAP_NET_ADMIN"]);
        assert_eq!(
            missing_in("CapEff:\t0000000000000000\n"),
            ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"]
        );
        assert_eq!(missing_in(""), ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"]);
    }
}
