//! The grant rules: FIFO, exclusive against shared, a semaphore of N,
//! release, node lives that end, and tokens that only grow.

use chrono::{DateTime, TimeZone, Utc};

use super::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn life(node: &str) -> NodeLife {
    NodeLife {
        node: node.to_owned(),
        life: now(),
    }
}

fn ask(workflow: WorkflowId, mode: LockMode, limit: Option<u32>) -> LockRequest {
    LockRequest {
        workflow,
        life: life("a"),
        mode,
        limit,
        step: "apply".to_owned(),
    }
}

fn everyone(_: &NodeLife) -> bool {
    true
}

fn held(answer: Answer) -> Option<u64> {
    match answer {
        Answer::Held { token, .. } => Some(token),
        Answer::Waiting { .. } => None,
    }
}

#[test]
fn exclusive_grants_one_at_a_time_in_the_order_asked() {
    let mut lock = LockRecord::new("env:prod");
    let (one, two, three) = (WorkflowId::new(), WorkflowId::new(), WorkflowId::new());
    let exclusive = |w| ask(w, LockMode::Exclusive, None);
    assert_eq!(
        held(lock.request(&exclusive(one), &everyone, now()).0),
        Some(1)
    );
    assert_eq!(
        lock.request(&exclusive(two), &everyone, now()).0,
        Answer::Waiting {
            position: 0,
            fresh: true
        }
    );
    assert_eq!(
        lock.request(&exclusive(three), &everyone, now()).0,
        Answer::Waiting {
            position: 1,
            fresh: true
        }
    );
    // Asking again keeps the place in line, and the hold.
    assert_eq!(
        lock.request(&exclusive(three), &everyone, now()).0,
        Answer::Waiting {
            position: 1,
            fresh: false
        }
    );
    assert_eq!(
        lock.request(&exclusive(one), &everyone, now()).0,
        Answer::Held {
            token: 1,
            fresh: false
        }
    );
    let (token, moves) = lock.release(one, &everyone, now());
    assert_eq!(token, Some(1));
    assert_eq!(moves.granted, vec![(two, 2)]);
    assert_eq!(
        held(lock.request(&exclusive(two), &everyone, now()).0),
        Some(2)
    );
    lock.release(two, &everyone, now());
    assert_eq!(
        held(lock.request(&exclusive(three), &everyone, now()).0),
        Some(3)
    );
    lock.release(three, &everyone, now());
    assert!(lock.idle());
    assert_eq!(lock.fencing, 3, "the counter stays when the lock is idle");
}

#[test]
fn shared_holders_share_and_an_exclusive_waiter_blocks_later_ones() {
    let mut lock = LockRecord::new("db");
    let (r1, r2, w, r3) = (
        WorkflowId::new(),
        WorkflowId::new(),
        WorkflowId::new(),
        WorkflowId::new(),
    );
    let shared = |id| ask(id, LockMode::Shared, None);
    assert!(held(lock.request(&shared(r1), &everyone, now()).0).is_some());
    assert!(held(lock.request(&shared(r2), &everyone, now()).0).is_some());
    assert!(
        held(
            lock.request(&ask(w, LockMode::Exclusive, None), &everyone, now())
                .0
        )
        .is_none()
    );
    // A shared request would fit, but the exclusive one asked first.
    assert_eq!(
        lock.request(&shared(r3), &everyone, now()).0,
        Answer::Waiting {
            position: 1,
            fresh: true
        }
    );
    lock.release(r1, &everyone, now());
    assert!(
        held(
            lock.request(&ask(w, LockMode::Exclusive, None), &everyone, now())
                .0
        )
        .is_none()
    );
    let (_, moves) = lock.release(r2, &everyone, now());
    assert_eq!(moves.granted, vec![(w, 3)]);
    let (_, moves) = lock.release(w, &everyone, now());
    assert_eq!(moves.granted, vec![(r3, 4)]);
}

#[test]
fn a_semaphore_of_n_grants_at_most_n() {
    let mut lock = LockRecord::new("slots");
    let ids: Vec<WorkflowId> = (0..4).map(|_| WorkflowId::new()).collect();
    let answers: Vec<Option<u64>> = ids
        .iter()
        .map(|id| {
            held(
                lock.request(&ask(*id, LockMode::Shared, Some(2)), &everyone, now())
                    .0,
            )
        })
        .collect();
    assert_eq!(answers, vec![Some(1), Some(2), None, None]);
    let (_, moves) = lock.release(ids[0], &everyone, now());
    assert_eq!(moves.granted, vec![(ids[2], 3)]);
}

#[test]
fn a_dead_node_life_loses_its_hold_and_its_place() {
    let mut lock = LockRecord::new("env:prod");
    let (dead, waiting, late) = (WorkflowId::new(), WorkflowId::new(), WorkflowId::new());
    let mut first = ask(dead, LockMode::Exclusive, None);
    first.life = life("gone");
    lock.request(&first, &everyone, now());
    let mut second = ask(waiting, LockMode::Exclusive, None);
    second.life = life("gone");
    lock.request(&second, &everyone, now());
    let alive = |l: &NodeLife| l.node != "gone";
    let (answer, moves) = lock.request(&ask(late, LockMode::Exclusive, None), &alive, now());
    assert_eq!(
        answer,
        Answer::Held {
            token: 2,
            fresh: true
        }
    );
    assert_eq!(moves.expired, vec![(dead, Some(1)), (waiting, None)]);
}

#[test]
fn a_restarted_node_waits_for_its_old_life_and_gets_a_new_token() {
    let mut lock = LockRecord::new("env:prod");
    let workflow = WorkflowId::new();
    let old = ask(workflow, LockMode::Exclusive, None);
    assert_eq!(held(lock.request(&old, &everyone, now()).0), Some(1));
    let mut again = old.clone();
    again.life.life = now() + chrono::Duration::seconds(5);
    // The old life is gone: the hold goes with it, and the new life is
    // granted afresh.
    let alive = |l: &NodeLife| l.life != now();
    assert_eq!(
        lock.request(&again, &alive, now()).0,
        Answer::Held {
            token: 2,
            fresh: true
        }
    );
}

#[test]
fn a_workflow_on_two_nodes_holds_once_until_both_lives_end() {
    let mut lock = LockRecord::new("env:prod");
    let (workflow, other) = (WorkflowId::new(), WorkflowId::new());
    let on_a = ask(workflow, LockMode::Exclusive, None);
    let mut on_b = on_a.clone();
    on_b.life = life("b");
    assert_eq!(held(lock.request(&on_a, &everyone, now()).0), Some(1));
    // The second life joins the one grant with a new token: a takeover
    // from a life not yet seen dead is fenced like any other.
    assert_eq!(
        lock.request(&on_b, &everyone, now()).0,
        Answer::Held {
            token: 2,
            fresh: true
        }
    );
    assert_eq!(held(lock.request(&on_b, &everyone, now()).0), Some(2));
    assert_eq!(lock.fencing, 2);
    // The first life asks again (its next step, or a retry): the token
    // was given to the other since, so it gets a newer one, and the other
    // after it again: a token is never handed to a second life, so each
    // attempt that enters is fenced above every one before it (the
    // two-node kill -9 drill saw a takeover enter with its victim's).
    assert_eq!(held(lock.request(&on_a, &everyone, now()).0), Some(3));
    assert_eq!(held(lock.request(&on_a, &everyone, now()).0), Some(3));
    assert_eq!(held(lock.request(&on_b, &everyone, now()).0), Some(4));
    assert_eq!(lock.holders[0].lives.len(), 2);
    let without_a = |l: &NodeLife| l.node != "a";
    let mut wait = ask(other, LockMode::Exclusive, None);
    wait.life = life("b");
    assert!(held(lock.request(&wait, &without_a, now()).0).is_none());
    let no_one = |_: &NodeLife| false;
    assert_eq!(lock.holders.len(), 1);
    lock.expire(&no_one, &mut Moves::default());
    assert!(lock.idle());
}

#[test]
fn a_takeover_never_enters_with_the_token_of_the_life_it_took_over_from() {
    let mut lock = LockRecord::new("env:prod");
    let workflow = WorkflowId::new();
    let on_a = ask(workflow, LockMode::Exclusive, None);
    let mut on_b = on_a.clone();
    on_b.life = life("b");
    // Both nodes asked for the workflow's task; `a` asked last and runs
    // it with token 3, so the lives are `[b, a]`.
    assert_eq!(held(lock.request(&on_a, &everyone, now()).0), Some(1));
    assert_eq!(held(lock.request(&on_b, &everyone, now()).0), Some(2));
    assert_eq!(held(lock.request(&on_a, &everyone, now()).0), Some(3));
    // `a` dies inside; `b` takes the task over. The hold stays (`b` is
    // one of its lives) but the token goes with `a`: `b` gets a newer
    // one, and the change is announced as a grant.
    let without_a = |l: &NodeLife| l.node != "a";
    let (answer, moves) = lock.request(&on_b, &without_a, now());
    assert_eq!(held(answer), Some(4));
    assert_eq!(moves.granted, vec![(workflow, 4)]);
    assert!(moves.expired.is_empty());
    assert_eq!(lock.holders[0].lives, vec![life("b")]);
    assert_eq!(held(lock.request(&on_b, &without_a, now()).0), Some(4));
    // A life that ends while not the token's leaves the token alone.
    let on_c = {
        let mut c = on_a.clone();
        c.life = life("c");
        c
    };
    assert_eq!(held(lock.request(&on_c, &everyone, now()).0), Some(5));
    let without_b = |l: &NodeLife| l.node != "b";
    assert_eq!(held(lock.request(&on_c, &without_b, now()).0), Some(5));
    assert_eq!(lock.fencing, 5);
}

#[test]
fn env_var_names_and_keys() {
    assert_eq!(env_var("db-main"), "ORCHESTRATOR_LOCK_DB_MAIN");
    assert_eq!(env_var("env"), "ORCHESTRATOR_LOCK_ENV");
    assert!(valid_key("env_1"));
    assert!(!valid_key("1env"));
    assert!(!valid_key("e.v"));
}

#[test]
fn tokens_are_put_in_where_referenced() {
    let tokens = Tokens::from([("env".to_owned(), 7)]);
    let value = serde_json::json!({"headers": {"X-Fence": "${locks.env.token}"}, "n": ["t=${locks.env.token}", "${secrets.x}"]});
    assert_eq!(
        put_tokens(&value, &tokens).unwrap(),
        serde_json::json!({"headers": {"X-Fence": "7"}, "n": ["t=7", "${secrets.x}"]})
    );
    assert!(
        put_tokens(&serde_json::json!("${locks.db.token}"), &tokens)
            .unwrap_err()
            .contains("`db`")
    );
}

#[test]
fn the_line_is_bounded() {
    let mut lock = LockRecord::new("busy");
    lock.request(
        &ask(WorkflowId::new(), LockMode::Exclusive, None),
        &everyone,
        now(),
    );
    for _ in 0..MAX_WAITERS {
        lock.request(
            &ask(WorkflowId::new(), LockMode::Exclusive, None),
            &everyone,
            now(),
        );
    }
    assert_eq!(lock.waiters.len(), MAX_WAITERS);
    let (answer, _) = lock.request(
        &ask(WorkflowId::new(), LockMode::Exclusive, None),
        &everyone,
        now(),
    );
    assert_eq!(
        answer,
        Answer::Waiting {
            position: MAX_WAITERS,
            fresh: false
        }
    );
    assert_eq!(
        lock.waiters.len(),
        MAX_WAITERS,
        "no place is taken past the bound"
    );
}
