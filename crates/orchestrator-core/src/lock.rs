//! Named resource locks: what a template declares ([`LockSpec`]), what a
//! task carries once its workflow is submitted ([`LockClaim`]), the stored
//! state of one lock ([`LockRecord`]: holders, waiters in the order they
//! asked, and a fencing counter that only grows) and the grant rules, as
//! plain functions of the record, the time and which node lives are alive.
//!
//! The rules: waiters are granted strictly in the order they asked (no
//! later request overtakes an earlier one that cannot be granted yet); an
//! exclusive grant needs no other holder; a shared grant needs no
//! exclusive holder and, under `limit: N`, fewer than N holders. Every
//! grant takes the next fencing token. A lock belongs to a workflow, from
//! one life of one node: a holder or waiter whose node life is no longer
//! alive (its node stopped sending heartbeats for a lease, or restarted)
//! is dropped before anything is decided.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::WorkflowId;
use crate::refs::{Piece, Root};

/// The most waiters one lock record keeps in line. One more asks again
/// later without a place (it is not lost: its task stays queued), so that
/// a record stays small however many workflows pile up behind a lock.
pub const MAX_WAITERS: usize = 10_000;

/// How a lock is held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Any number of shared holders together (at most `limit`, if given),
    /// never with an exclusive one.
    Shared,
}

impl LockMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }
}

/// A lock as a template declares it, under `locks.<key>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockSpec {
    /// The resource's name; may hold `${workflow.input.<key>}`, resolved
    /// at submission (`env:${workflow.input.env}`).
    pub name: String,
    #[serde(default)]
    pub mode: LockMode,
    /// A semaphore: at most this many shared holders at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The steps that need the lock (`ref_name`s); every step when empty.
    /// It is held from the first of them to start until the last ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
}

/// A lock one task needs, with its name resolved at submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockClaim {
    /// The key the template declares it under: what scripts
    /// (`ORCHESTRATOR_LOCK_<KEY>`) and http steps (`${locks.<key>.token}`)
    /// know it by.
    pub key: String,
    /// The resource's name, shared by every workflow that asks for it.
    pub name: String,
    #[serde(default)]
    pub mode: LockMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The environment variable that gives a script the fencing token of the
/// lock declared under `key`: `ORCHESTRATOR_LOCK_` and the key in upper
/// case with `-` as `_` (`db-main` gives `ORCHESTRATOR_LOCK_DB_MAIN`).
pub fn env_var(key: &str) -> String {
    let mut name = String::from("ORCHESTRATOR_LOCK_");
    name.extend(key.chars().map(|c| match c {
        '-' => '_',
        c => c.to_ascii_uppercase(),
    }));
    name
}

/// Whether `key` may name a lock in a template: 1-63 letters, digits, `_`
/// or `-`, starting with a letter.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 63
        && key.as_bytes()[0].is_ascii_alphabetic()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One life of one node: its id and when that life started, as its
/// heartbeats say. A hold or a place in line lasts while its life does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeLife {
    pub node: String,
    pub life: DateTime<Utc>,
}

/// A grant of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockHolder {
    pub workflow: WorkflowId,
    /// The node lives running the workflow's tasks under this grant (more
    /// than one when its steps run on several nodes), the one `token` is
    /// for last (given to it, or, after the life it was given to ended,
    /// waiting for it to ask); the grant ends when the last of them does.
    pub lives: Vec<NodeLife>,
    pub mode: LockMode,
    /// The fencing token of this grant.
    pub token: u64,
    /// The step whose task asked for it.
    pub step: String,
    /// When it was granted.
    pub since: DateTime<Utc>,
}

/// A request not granted yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockWaiter {
    pub workflow: WorkflowId,
    pub life: NodeLife,
    pub mode: LockMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    pub step: String,
    /// When it first asked.
    pub since: DateTime<Utc>,
}

/// One lock as stored: one record per name, changed by compare-and-set on
/// `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockRecord {
    pub name: String,
    pub version: u64,
    /// The last fencing token handed out; only grows, and stays when the
    /// lock has neither holder nor waiter.
    pub fencing: u64,
    pub holders: Vec<LockHolder>,
    /// In the order they asked.
    pub waiters: Vec<LockWaiter>,
}

/// A request for a lock by one task's attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct LockRequest {
    pub workflow: WorkflowId,
    pub life: NodeLife,
    pub mode: LockMode,
    pub limit: Option<u32>,
    pub step: String,
}

impl LockRequest {
    pub fn of(claim: &LockClaim, workflow: WorkflowId, life: NodeLife, step: &str) -> LockRequest {
        LockRequest {
            workflow,
            life,
            mode: claim.mode,
            limit: claim.limit,
            step: step.to_owned(),
        }
    }
}

/// What a request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Held with this token; `fresh` if granted by this request.
    Held { token: u64, fresh: bool },
    /// Waiting; `position` 0 is the first in line.
    Waiting { position: usize, fresh: bool },
}

/// What changed in a record, for the events it announces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Moves {
    /// Owners dropped because their node life ended, with their token if
    /// they held the lock.
    pub expired: Vec<(WorkflowId, Option<u64>)>,
    /// Grants made to waiters other than the requester.
    pub granted: Vec<(WorkflowId, u64)>,
}

impl LockRecord {
    /// A lock nobody asked for yet.
    pub fn new(name: &str) -> LockRecord {
        LockRecord {
            name: name.to_owned(),
            version: 0,
            fencing: 0,
            holders: Vec::new(),
            waiters: Vec::new(),
        }
    }

    /// Whether it has neither holder nor waiter.
    pub fn idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// Drops every node life `alive` says ended: from holders (a holder
    /// goes with its last life) and waiters. A hold that outlives the life
    /// its token was given to (the last of `lives`) takes a new token: the
    /// lives left never saw the old one, and the next of them to ask must
    /// not enter with the token of the life it took over from (the
    /// two-node kill -9 drill saw exactly that: lives `[b, a]`, `a`
    /// killed inside, and `b`'s takeover entered with `a`'s token).
    pub fn expire(&mut self, alive: &dyn Fn(&NodeLife) -> bool, moves: &mut Moves) {
        let fencing = &mut self.fencing;
        self.holders.retain_mut(|h| {
            let given_to_alive = h.lives.last().is_some_and(alive);
            h.lives.retain(|l| alive(l));
            if h.lives.is_empty() {
                moves.expired.push((h.workflow, Some(h.token)));
                return false;
            }
            if !given_to_alive {
                *fencing += 1;
                h.token = *fencing;
                moves.granted.push((h.workflow, h.token));
            }
            true
        });
        self.waiters.retain(|w| {
            let keep = alive(&w.life);
            if !keep {
                moves.expired.push((w.workflow, None));
            }
            keep
        });
    }

    /// A request: the lock held already by the workflow (its node life
    /// joins the hold), granted now, or waiting its turn. Dead node lives
    /// are dropped first; then waiters are granted in order.
    pub fn request(
        &mut self,
        request: &LockRequest,
        alive: &dyn Fn(&NodeLife) -> bool,
        now: DateTime<Utc>,
    ) -> (Answer, Moves) {
        let mut moves = Moves::default();
        self.expire(alive, &mut moves);
        if let Some(held) = self
            .holders
            .iter_mut()
            .find(|h| h.workflow == request.workflow)
        {
            // The last of `lives` is the life the current token is for:
            // it asks again and keeps it.
            if held.lives.last() == Some(&request.life) {
                let token = held.token;
                return (
                    Answer::Held {
                        token,
                        fresh: false,
                    },
                    moves,
                );
            }
            // Another life joins the hold, or asks again after another
            // got a newer token: another node runs a step of the
            // workflow, or took over the task of a life that still looks
            // alive (its heartbeat outlives its task's lease by up to a
            // heartbeat). Either way it gets a new token, so that
            // whatever the other lives still send is the stale one: a
            // token is never handed to a second life (a takeover that
            // found itself among the lives once got the token of the
            // life it took over from).
            self.fencing += 1;
            held.token = self.fencing;
            held.lives.retain(|l| l != &request.life);
            held.lives.push(request.life.clone());
            return (
                Answer::Held {
                    token: self.fencing,
                    fresh: true,
                },
                moves,
            );
        }
        let mut fresh = false;
        let line_full = self.waiters.len() >= MAX_WAITERS;
        match self
            .waiters
            .iter_mut()
            .find(|w| w.workflow == request.workflow)
        {
            // The same workflow from another life (a takeover, a restart):
            // the new life waits in the old one's place.
            Some(waiter) => waiter.life = request.life.clone(),
            None if line_full => {
                let position = MAX_WAITERS;
                return (
                    Answer::Waiting {
                        position,
                        fresh: false,
                    },
                    moves,
                );
            }
            None => {
                fresh = true;
                self.waiters.push(LockWaiter {
                    workflow: request.workflow,
                    life: request.life.clone(),
                    mode: request.mode,
                    limit: request.limit,
                    step: request.step.clone(),
                    since: now,
                });
            }
        }
        for (workflow, token) in self.grant_waiters(now) {
            if workflow == request.workflow {
                return (Answer::Held { token, fresh: true }, moves);
            }
            moves.granted.push((workflow, token));
        }
        let position = self
            .waiters
            .iter()
            .position(|w| w.workflow == request.workflow)
            .unwrap_or(self.waiters.len());
        (Answer::Waiting { position, fresh }, moves)
    }

    /// Releases `workflow`'s hold and its place in line; then grants
    /// waiters in order. Returns the token it held, if it held one.
    pub fn release(
        &mut self,
        workflow: WorkflowId,
        alive: &dyn Fn(&NodeLife) -> bool,
        now: DateTime<Utc>,
    ) -> (Option<u64>, Moves) {
        let mut moves = Moves::default();
        let held = self
            .holders
            .iter()
            .find(|h| h.workflow == workflow)
            .map(|h| h.token);
        self.holders.retain(|h| h.workflow != workflow);
        self.waiters.retain(|w| w.workflow != workflow);
        self.expire(alive, &mut moves);
        moves.granted.extend(self.grant_waiters(now));
        (held, moves)
    }

    /// Whether `workflow` holds the lock or waits for it.
    pub fn involves(&self, workflow: WorkflowId) -> bool {
        self.holders.iter().any(|h| h.workflow == workflow)
            || self.waiters.iter().any(|w| w.workflow == workflow)
    }

    /// Grants the waiters at the front of the line that fit, in order,
    /// stopping at the first that does not (FIFO: nobody overtakes).
    pub fn grant_waiters(&mut self, now: DateTime<Utc>) -> Vec<(WorkflowId, u64)> {
        let mut granted = Vec::new();
        while let Some(first) = self.waiters.first() {
            if !self.fits(first.mode, first.limit) {
                break;
            }
            let waiter = self.waiters.remove(0);
            self.fencing += 1;
            granted.push((waiter.workflow, self.fencing));
            self.holders.push(LockHolder {
                workflow: waiter.workflow,
                lives: vec![waiter.life],
                mode: waiter.mode,
                token: self.fencing,
                step: waiter.step,
                since: now,
            });
        }
        granted
    }

    /// Whether a grant in `mode` (under `limit`) fits the holders now.
    fn fits(&self, mode: LockMode, limit: Option<u32>) -> bool {
        match mode {
            LockMode::Exclusive => self.holders.is_empty(),
            LockMode::Shared => {
                self.holders.iter().all(|h| h.mode == LockMode::Shared)
                    && limit.is_none_or(|n| self.holders.len() < n as usize)
            }
        }
    }
}

/// The tokens a task's attempt holds, by lock key: what its script's
/// environment and its http step's `${locks.<key>.token}` are made of.
pub type Tokens = BTreeMap<String, u64>;

/// `value` with every `${locks.<key>.token}` replaced by the token held
/// under `key`; an error names a key the attempt holds no token for.
pub fn put_tokens(value: &Value, tokens: &Tokens) -> Result<Value, String> {
    match value {
        Value::String(text) if text.contains("${locks.") => {
            let Ok(pieces) = crate::refs::scan(text) else {
                return Ok(value.clone());
            };
            let mut out = String::new();
            for piece in pieces {
                match piece {
                    Piece::Text(t) => out.push_str(&t),
                    Piece::Ref(r) => match &r.root {
                        Root::Lock(key) => {
                            let token = tokens
                                .get(key)
                                .ok_or_else(|| format!("{r}: the step holds no lock `{key}`"))?;
                            out.push_str(&token.to_string());
                        }
                        _ => out.push_str(&r.to_string()),
                    },
                }
            }
            Ok(Value::String(out))
        }
        Value::Array(items) => items
            .iter()
            .map(|v| put_tokens(v, tokens))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| Ok((k.clone(), put_tokens(v, tokens)?)))
            .collect::<Result<_, _>>()
            .map(Value::Object),
        other => Ok(other.clone()),
    }
}

#[cfg(test)]
mod tests;
