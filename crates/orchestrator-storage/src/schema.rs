//! Schema versions as `orchestrator db status` reports them, the same shape
//! for every backend: SurrealDB migrations, or the filesystem layout version.

use std::fmt;

/// The store's schema against what this build expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaStatus {
    pub backend: &'static str,
    /// Where the store is: a directory, or a URL with namespace and
    /// database. Never a password.
    pub location: String,
    /// Every version either side knows of, oldest first.
    pub entries: Vec<SchemaEntry>,
}

impl SchemaStatus {
    /// Whether a service could start on this store without changing it.
    pub fn is_up_to_date(&self) -> bool {
        self.entries.iter().all(|e| e.state == EntryState::Applied)
    }
}

/// One migration (or layout version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaEntry {
    pub version: u32,
    pub name: String,
    pub state: EntryState,
    /// SHA-256 of the migration file, as recorded when applied (or of this
    /// build's file while pending).
    pub checksum: Option<String>,
    pub applied_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    Applied,
    /// In this build, not yet applied: the next start applies it.
    Pending,
    /// Applied, but this build's file differs from what was applied.
    Changed,
    /// Started but never finished: the start was interrupted.
    Dirty,
    /// Applied by a newer build; this one does not know it.
    Unknown,
}

impl EntryState {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Applied => "applied",
            EntryState::Pending => "pending",
            EntryState::Changed => "changed since applied",
            EntryState::Dirty => "dirty",
            EntryState::Unknown => "unknown to this build",
        }
    }
}

impl fmt::Display for EntryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
