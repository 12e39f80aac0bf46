//! The digest, the decision rules and the gate's moves.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::json;

use super::*;
use crate::task::test_support::task_of;
use crate::{Task, TaskStatus, Workflow, WorkflowId, decide_task};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn coverage() -> Coverage {
    Coverage {
        inputs: value_hash(&json!({"env": "prod"})),
        template: "apply@1 sha256:aa".into(),
        scripts: BTreeMap::from([("apply.sh".into(), sha256_hex(b"echo apply"))]),
        outputs: BTreeMap::from([("plan".into(), value_hash(&json!({"adds": 2})))]),
    }
}

#[test]
fn each_covered_part_changes_the_digest_and_is_named() {
    let base = coverage();
    let check = |change: fn(&mut Coverage), says: &str| {
        let mut changed = base.clone();
        change(&mut changed);
        assert_ne!(changed.digest(), base.digest(), "{says}");
        let reasons = changed.changes_since(&base).join("; ");
        assert!(reasons.contains(says), "{reasons} should say {says}");
    };
    check(
        |c| c.inputs = value_hash(&json!({"env": "staging"})),
        "inputs changed",
    );
    check(
        |c| c.template = "apply@1 sha256:bb".into(),
        "template changed",
    );
    check(
        |c| {
            c.scripts
                .insert("apply.sh".into(), sha256_hex(b"echo other"));
        },
        "script apply.sh changed",
    );
    check(
        |c| {
            c.scripts.insert("extra.sh".into(), sha256_hex(b"x"));
        },
        "script extra.sh is new",
    );
    check(
        |c| {
            c.outputs
                .insert("plan".into(), value_hash(&json!({"adds": 3})));
        },
        "output of step plan changed",
    );
}

#[test]
fn unrelated_changes_leave_the_digest_alone() {
    let base = coverage();
    // Key order and white space are not content.
    let mut same = base.clone();
    same.inputs = value_hash(&serde_json::from_str(r#"{ "env" :"prod" }"#).unwrap());
    assert_eq!(same.digest(), base.digest());
    assert!(same.changes_since(&base).is_empty());
    assert_eq!(
        value_hash(&json!({"a": 1, "b": 2})),
        value_hash(&serde_json::from_str(r#"{"b":2,"a":1}"#).unwrap())
    );
}

fn policy(block: serde_json::Value) -> ApprovalPolicy {
    ApprovalPolicy::parse(&block).unwrap()
}

#[test]
fn policies_are_checked_and_bounded() {
    let refused = |block: serde_json::Value, at: &str| {
        let (field, message) = ApprovalPolicy::parse(&block).unwrap_err();
        assert_eq!(field, at, "{message}");
    };
    refused(json!({}), "");
    refused(json!({"approvers": {}}), "approvers");
    refused(
        json!({"approvers": {"role": "operator", "tokens": ["a"]}}),
        "approvers",
    );
    refused(json!({"approvers": {"role": "viewer"}}), "approvers.role");
    refused(
        json!({"approvers": {"role": "operator"}, "required": 0}),
        "required",
    );
    refused(
        json!({"approvers": {"role": "operator"}, "required": 11}),
        "required",
    );
    refused(
        json!({"approvers": {"tokens": ["a"]}, "required": 2}),
        "required",
    );
    refused(
        json!({"approvers": {"role": "operator"}, "timeout": "31d"}),
        "timeout",
    );
    let many: Vec<String> = (0..33).map(|i| format!("t{i}")).collect();
    refused(json!({"approvers": {"tokens": many}}), "approvers.tokens");
    let p = policy(json!({"approvers": {"role": "operator"}}));
    assert_eq!(p.required, 1);
    assert!(!p.allow_submitter);
    assert_eq!(p.on_timeout, OnTimeout::Reject);
    assert_eq!(p.timeout_duration().unwrap(), DEFAULT_GATE_TIMEOUT);
}

#[test]
fn who_may_decide() {
    let by_role = policy(json!({"approvers": {"role": "admin"}}));
    let operator = Decider {
        actor: "bob",
        role: Some(Role::Operator),
    };
    let admin = Decider {
        actor: "carol",
        role: Some(Role::Admin),
    };
    assert!(
        may_decide(&by_role, operator, None, Choice::Approve)
            .unwrap_err()
            .contains("needs the admin role")
    );
    assert!(may_decide(&by_role, admin, None, Choice::Approve).is_ok());
    // The submitter may not approve by default, but may reject.
    let refusal = may_decide(&by_role, admin, Some("carol"), Choice::Approve).unwrap_err();
    assert!(refusal.contains("submitted this workflow"), "{refusal}");
    assert!(may_decide(&by_role, admin, Some("carol"), Choice::Reject).is_ok());
    let lenient = policy(json!({"approvers": {"role": "admin"}, "allow_submitter": true}));
    assert!(may_decide(&lenient, admin, Some("carol"), Choice::Approve).is_ok());
    let by_name = policy(json!({"approvers": {"tokens": ["alice"]}}));
    assert!(
        may_decide(&by_name, admin, None, Choice::Approve)
            .unwrap_err()
            .contains("only alice may")
    );
    let alice = Decider {
        actor: "alice",
        role: Some(Role::Viewer),
    };
    assert!(may_decide(&by_name, alice, None, Choice::Approve).is_ok());
}

fn gate() -> Task {
    let mut task = task_of(WorkflowId::new(), Some("approve"), vec![]);
    task.status = TaskStatus::Pending;
    task.approval = Some(Box::new(Gate::new(Some("sam".into()))));
    task.open_gate(Duration::from_secs(60), now());
    task
}

fn verdict(choice: Choice, by: &str, digest: &str) -> Verdict {
    Verdict {
        choice,
        by: by.into(),
        at: now(),
        digest: digest.into(),
        comment: None,
    }
}

#[test]
fn an_open_gate_is_never_released_and_passes_on_its_approvals() {
    let workflow = Workflow::new("t", "t", now());
    let mut task = gate();
    assert_eq!(decide_task(&workflow, &task, |_| None), None);
    let cov = coverage();
    let d = cov.digest();
    assert_eq!(
        task.decide_gate(verdict(Choice::Approve, "a", &d), &cov, 2, now())
            .unwrap(),
        Approval::Counted { have: 1, need: 2 }
    );
    assert_eq!(task.status, TaskStatus::Pending);
    assert!(matches!(
        task.decide_gate(verdict(Choice::Approve, "a", &d), &cov, 2, now()),
        Err(GateRefusal::AlreadyApproved(_))
    ));
    assert_eq!(
        task.decide_gate(verdict(Choice::Approve, "b", &d), &cov, 2, now())
            .unwrap(),
        Approval::Passed
    );
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output.as_ref().unwrap()["digest"], json!(d));
    // Decided once: a late decision is refused.
    assert!(matches!(
        task.decide_gate(verdict(Choice::Reject, "c", &d), &cov, 2, now()),
        Err(GateRefusal::NotWaiting(..))
    ));
}

#[test]
fn a_stale_digest_is_refused_and_a_change_invalidates_earlier_approvals() {
    let mut task = gate();
    let before = coverage();
    task.decide_gate(
        verdict(Choice::Approve, "a", &before.digest()),
        &before,
        2,
        now(),
    )
    .unwrap();
    let mut after = before.clone();
    after
        .scripts
        .insert("apply.sh".into(), sha256_hex(b"rm -rf"));
    let refused = task
        .decide_gate(
            verdict(Choice::Approve, "b", &before.digest()),
            &after,
            2,
            now(),
        )
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains(&before.digest()) && message.contains(&after.digest()),
        "{message}"
    );
    // On the new digest: the earlier approval no longer counts.
    assert_eq!(
        task.decide_gate(
            verdict(Choice::Approve, "b", &after.digest()),
            &after,
            2,
            now()
        )
        .unwrap(),
        Approval::Counted { have: 1, need: 2 }
    );
    let gate = task.approval.as_ref().unwrap();
    assert_eq!(gate.invalidations, 1);
    assert_eq!(
        gate.invalidated_because.as_deref(),
        Some("script apply.sh changed")
    );
}

#[test]
fn rejection_cancels_and_timeout_follows_the_policy() {
    let cov = coverage();
    let mut task = gate();
    let mut no = verdict(Choice::Reject, "a", &cov.digest());
    no.comment = Some("not today".into());
    task.decide_gate(no, &cov, 1, now()).unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(task.error.as_deref(), Some("rejected by a: not today"));

    let later = now() + chrono::Duration::seconds(61);
    let mut task = gate();
    assert!(!task.gate_overdue(now()));
    assert!(task.gate_overdue(later));
    task.time_out_gate(OnTimeout::Fail, later).unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    let mut task = gate();
    task.time_out_gate(OnTimeout::Reject, later).unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
}

#[test]
fn a_retry_closes_the_gate_again() {
    let mut task = gate();
    task.time_out_gate(OnTimeout::Fail, now()).unwrap();
    task.rerun(now()).unwrap();
    let gate = task.approval.as_ref().unwrap();
    assert_eq!(**gate, Gate::new(Some("sam".into())));
}
