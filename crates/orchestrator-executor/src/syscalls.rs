//! The system calls a sandboxed script is refused, as a seccomp filter
//! the helper installs on itself before it starts a script (which
//! inherits it, as does everything the script starts).
//!
//! Only the kernel's keyrings, so far. They are not a namespace of their
//! own: every process inherits its parent's session keyring (the
//! service's, which systemd makes for it, or the login's it was started
//! from), and a user's keyring is the same for every process of the user
//! outside a user namespace. Through them a script could read what the
//! host keeps there, and leave a key for any later script to find, in a
//! sandbox of its own or not. Container engines refuse the same calls.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The refused calls fail with this error, as the kernel's own refusal
/// would read.
const REFUSED_WITH: u32 = nix::libc::EPERM as u32;

/// The calls that reach the keyrings.
const KEYRING_CALLS: [nix::libc::c_long; 3] = [
    nix::libc::SYS_add_key,
    nix::libc::SYS_keyctl,
    nix::libc::SYS_request_key,
];

/// On x86_64, the bit that makes a call one of the x32 ABI: a 64-bit
/// process may make those too (where the kernel was built with x32 and
/// not booted without it), under the same architecture the filter
/// checks, with the call's number and this bit. A filter matching the
/// plain numbers alone would let them through.
const X32_SYSCALL_BIT: nix::libc::c_long = 0x4000_0000;

/// The numbers the filter refuses: each call's, and on x86_64 its x32
/// twin's.
fn refused_numbers() -> Vec<nix::libc::c_long> {
    let mut numbers = KEYRING_CALLS.to_vec();
    if cfg!(target_arch = "x86_64") {
        numbers.extend(KEYRING_CALLS.iter().map(|call| call | X32_SYSCALL_BIT));
    }
    numbers
}

/// The filter, compiled for the architecture this binary is built for.
fn filter() -> Result<BpfProgram, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    // No rule for a call: refused whatever its arguments.
    let rules = refused_numbers().into_iter().map(|call| (call, Vec::new()));
    let filter = SeccompFilter::new(
        rules.collect::<BTreeMap<_, _>>(),
        SeccompAction::Allow,
        SeccompAction::Errno(REFUSED_WITH),
        arch,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

/// Installs the filter on this thread (and what it starts from now on).
/// Also sets `no_new_privs`, which `bwrap` has set already.
pub(crate) fn refuse_keyrings() -> Result<(), String> {
    let program = filter().map_err(|e| format!("cannot build the seccomp filter: {e}"))?;
    seccompiler::apply_filter(&program)
        .map_err(|e| format!("cannot install the seccomp filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the filter does is checked where it runs, in a sandbox
    /// (`tests/it/sandbox.rs`); here, that it builds for this machine.
    #[test]
    fn the_filter_builds_for_this_architecture() {
        let program = filter().unwrap();
        // The architecture check, then one test and return per call.
        let refused = refused_numbers();
        assert!(program.len() > refused.len() * 2, "{}", program.len());
        if cfg!(target_arch = "x86_64") {
            assert!(refused.contains(&(nix::libc::SYS_keyctl | X32_SYSCALL_BIT)));
        }
    }
}
