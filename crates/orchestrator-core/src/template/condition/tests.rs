//! The condition language: parsing, the checks' positions, evaluation.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::*;
use crate::refs::StepOutputs;

/// Evaluates `source` with inputs `{env: "prod", count: 3, tags: [...]}`,
/// each `{server: "a"}` and step `plan`'s output `plan`.
fn eval_with(source: &str, plan: Value) -> Result<bool, ConditionError> {
    let inputs = json!({"env": "prod", "count": 3, "tags": ["db", "web"], "flag": false});
    let each = json!({"server": "a"});
    let scope = Scope {
        workflow_input: Some(&inputs),
        check_mode: false,
        each: Some(&each),
        outputs: HashMap::from([("plan".to_owned(), StepOutputs::One(plan))]),
    };
    Condition::parse(source)?.evaluate(&scope)
}

fn eval(source: &str) -> Result<bool, ConditionError> {
    eval_with(
        source,
        json!({"changes": 2, "summary": {"destroy": 0}, "hosts": ["a", "b"]}),
    )
}

/// What a case expects: `Ok(value)` or `Err((column, message part))`.
type Expected<'a> = Result<bool, (usize, &'a str)>;

/// Each case: an expression and what it gives.
fn check(cases: &[(&str, Expected<'_>)]) {
    for (source, expected) in cases {
        match (eval(source), expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, *want, "{source}"),
            (Err(e), Err((column, part))) => {
                assert_eq!(e.column, *column, "{source}: {e}");
                assert!(e.message.contains(part), "{source}: `{e}` lacks `{part}`");
            }
            (got, want) => panic!("{source}: got {got:?}, expected {want:?}"),
        }
    }
}

#[test]
fn true_and_false() {
    check(&[
        ("workflow.input.env == 'prod'", Ok(true)),
        ("workflow.input.env == \"staging\"", Ok(false)),
        ("workflow.input.env != 'prod'", Ok(false)),
        ("plan.output.changes > 0", Ok(true)),
        (
            "plan.output.changes >= 2 && plan.output.changes <= 2",
            Ok(true),
        ),
        ("plan.output.summary.destroy == 0.0", Ok(true)),
        ("plan.output['summary'][\"destroy\"] < -1", Ok(false)),
        ("'db' in workflow.input.tags", Ok(true)),
        (
            "'x' in workflow.input.tags || workflow.input.count > 2",
            Ok(true),
        ),
        ("'destroy' in plan.output.summary", Ok(true)),
        ("plan.output.hosts[1] == 'b'", Ok(true)),
        ("workflow.input.env in ['prod', 'staging']", Ok(true)),
        ("!workflow.input.flag", Ok(true)),
        ("!(workflow.input.count == 3)", Ok(false)),
        ("each.server == 'a' && !workflow.check_mode", Ok(true)),
        ("'b' < 'c'", Ok(true)),
        ("null == null", Ok(true)),
        ("[1, 2] == [1, 2.0]", Ok(true)),
        // Short-circuit: the missing key is never read.
        ("false && plan.output.missing", Ok(false)),
        ("true || plan.output.missing", Ok(true)),
    ]);
}

#[test]
fn type_errors_name_the_column() {
    check(&[
        (
            "workflow.input.env",
            Err((1, "gives a string, not a boolean")),
        ),
        ("1 && true", Err((1, "`&&` needs booleans, got a number"))),
        (
            "false || 'x'",
            Err((10, "`||` needs booleans, got a string")),
        ),
        (
            "!workflow.input.count",
            Err((1, "`!` needs a boolean, got a number")),
        ),
        (
            "workflow.input.env < 3",
            Err((20, "compares two numbers or two strings")),
        ),
        (
            "1 in workflow.input.count",
            Err((3, "`in` needs a list or an object")),
        ),
        ("1 in plan.output.summary", Err((3, "needs a string key"))),
        ("-'x' == 1", Err((1, "`-` needs a number"))),
    ]);
}

#[test]
fn a_missing_value_is_an_error_at_its_column() {
    check(&[
        (
            "plan.output.missing == 1",
            Err((
                1,
                "`plan.output.missing`: the output of step `plan` has no such key",
            )),
        ),
        (
            "true && workflow.input.nope",
            Err((9, "`workflow.input.nope` does not exist")),
        ),
    ]);
    let e = eval_with("plan.output.x", Value::Null).unwrap_err();
    assert_eq!(e.column, 1);
}

#[test]
fn parse_errors_name_the_column() {
    let cases: &[(&str, usize, &str)] = &[
        ("", 1, "the expression is empty"),
        (
            "workflow.input.env ==",
            22,
            "expected a value, found the end",
        ),
        ("workflow.input.env = 'x'", 20, "unexpected character `=`"),
        ("(true", 6, "expected `)`"),
        ("'open", 1, "this string is not closed"),
        ("true false", 6, "expected an operator or the end"),
        ("1 < 2 < 3", 7, "can not follow a comparison"),
        ("foo == 1", 1, "unknown name `foo`"),
        ("workflow.env == 1", 1, "workflow.input.<key>"),
        ("secrets.token == 'x'", 1, "can not be read by a condition"),
        ("plan.output[x]", 13, "a list index or a quoted key"),
        ("99999999999999999999 > 1", 1, "out of range"),
        ("size(x)", 1, "unknown name `size`"),
        (
            "workflow.input.env (",
            20,
            "expected an operator or the end, found `(`",
        ),
    ];
    for (source, column, part) in cases {
        let e = Condition::parse(source).unwrap_err();
        assert_eq!(e.column, *column, "{source}: {e}");
        assert!(e.message.contains(part), "{source}: `{e}` lacks `{part}`");
    }
}

#[test]
fn length_parts_and_nesting_are_bounded() {
    let long = format!("'{}' == 'x'", "a".repeat(MAX_CONDITION_BYTES));
    let e = Condition::parse(&long).unwrap_err();
    assert!(e.message.contains("over the limit of 1024"), "{e}");
    let deep = format!("{}true{}", "(".repeat(40), ")".repeat(40));
    let e = Condition::parse(&deep).unwrap_err();
    assert!(e.message.contains("nests deeper than 32"), "{e}");
    let nots = format!("{}true", "!".repeat(40));
    assert!(Condition::parse(&nots).is_err());
    let wide = format!("[{}] == []", vec!["1"; 300].join(","));
    let e = Condition::parse(&wide).unwrap_err();
    assert!(e.message.contains("more than 256 parts"), "{e}");
    // Within the bounds.
    let fine = vec!["true"; 100].join(" && ");
    assert_eq!(
        Condition::parse(&fine).unwrap().evaluate(&Scope::default()),
        Ok(true)
    );
}

#[test]
fn references_are_listed_with_their_columns() {
    let c = Condition::parse("workflow.input.env == 'x' && deploy-vm.output.ok").unwrap();
    let found: Vec<(usize, String)> = c
        .references()
        .into_iter()
        .map(|(column, r)| (column, path_text(r)))
        .collect();
    assert_eq!(
        found,
        vec![
            (1, "workflow.input.env".to_owned()),
            (30, "deploy-vm.output.ok".to_owned())
        ]
    );
}
