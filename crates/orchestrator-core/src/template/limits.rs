//! Bounds on the work one submission may ask for. Every count here is
//! computed from the template and the submission's inputs *before* a task
//! is built (list lengths multiplied with checked arithmetic), so a
//! refusal costs no more than reading the request.

use serde_json::Value;

use super::{TemplateError, err};

/// Tokens an approval gate may name as its deciders (`approval.approvers.tokens`).
pub const MAX_GATE_APPROVER_TOKENS: usize = 32;
/// Approvals a gate may require (`approval.required`).
pub const MAX_GATE_REQUIRED: u32 = 10;
/// Steps whose outputs one gate may cover (`approval.covers`).
pub const MAX_GATE_COVERED_STEPS: usize = 32;
/// A decision's comment, in bytes.
pub const MAX_GATE_COMMENT_BYTES: usize = 2048;
/// The most locks one template may declare (`locks:`): each is asked for
/// and released by its own store write.
pub const MAX_LOCKS_PER_WORKFLOW: usize = 16;
/// The longest resolved lock name, in bytes.
pub const MAX_LOCK_NAME_BYTES: usize = 200;
/// The largest semaphore (`limit:`) of a shared lock.
pub const MAX_LOCK_LIMIT: u32 = 1_000;

/// The service's limits on one submission; each is a setting of its own
/// (named by [`Limit::setting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Instances of one `for_each` step: the product of its list lengths.
    pub max_step_instances: u64,
    /// Tasks of one workflow: the instances of all its steps.
    pub max_workflow_tasks: u64,
    /// Steps of one template.
    pub max_template_steps: u64,
    /// Items of one list input (and of one `for_each` list).
    pub max_list_items: u64,
    /// An inline template, as compact JSON.
    pub max_template_bytes: u64,
    /// A submission's inputs (`vars`), as compact JSON.
    pub max_input_bytes: u64,
}

impl Default for Limits {
    /// Generous for real work (the benchmarks submit 10,000 steps in
    /// one inline template), small enough that the largest submission
    /// costs tens of megabytes, not the machine.
    fn default() -> Self {
        Limits {
            max_step_instances: 1_000,
            max_workflow_tasks: 10_000,
            max_template_steps: 10_000,
            max_list_items: 1_000,
            max_template_bytes: 1024 * 1024,
            max_input_bytes: 64 * 1024,
        }
    }
}

/// One of the [`Limits`], for the message that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    StepInstances,
    WorkflowTasks,
    TemplateSteps,
    ListItems,
    TemplateBytes,
    InputBytes,
}

impl Limit {
    /// The service setting (its command-line flag) that sets the limit.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::StepInstances => "--max-step-instances",
            Limit::WorkflowTasks => "--max-workflow-tasks",
            Limit::TemplateSteps => "--max-template-steps",
            Limit::ListItems => "--max-list-items",
            Limit::TemplateBytes => "--max-template-bytes",
            Limit::InputBytes => "--max-input-bytes",
        }
    }

    /// What is counted, and per what.
    fn counts(self) -> (&'static str, &'static str) {
        match self {
            Limit::StepInstances => ("instances", "per step"),
            Limit::WorkflowTasks => ("tasks", "per workflow"),
            Limit::TemplateSteps => ("steps", "per template"),
            Limit::ListItems => ("items", "per list"),
            Limit::TemplateBytes => ("bytes", "per template"),
            Limit::InputBytes => ("bytes", "of inputs"),
        }
    }
}

impl Limits {
    pub fn value(&self, limit: Limit) -> u64 {
        match limit {
            Limit::StepInstances => self.max_step_instances,
            Limit::WorkflowTasks => self.max_workflow_tasks,
            Limit::TemplateSteps => self.max_template_steps,
            Limit::ListItems => self.max_list_items,
            Limit::TemplateBytes => self.max_template_bytes,
            Limit::InputBytes => self.max_input_bytes,
        }
    }

    /// Refuses `count` (`None`: it overflowed `u64`) when over `limit`,
    /// naming `field`, the count, the limit and its setting.
    pub fn check(
        &self,
        field: &str,
        limit: Limit,
        count: Option<u64>,
    ) -> Result<(), TemplateError> {
        let max = self.value(limit);
        if count.is_some_and(|n| n <= max) {
            return Ok(());
        }
        let (what, per) = limit.counts();
        let count = count.map_or_else(|| format!("more than {}", u64::MAX), |n| n.to_string());
        Err(err(
            field,
            format!(
                "{count} {what} exceed the limit of {max} {per} ({})",
                limit.setting()
            ),
        ))
    }

    /// Checks a step's `for_each` lists (`(key, length)` each) and returns
    /// its instances: their product, which may not overflow.
    pub fn step_instances(&self, at: &str, lists: &[(&str, usize)]) -> Result<u64, TemplateError> {
        for (key, length) in lists {
            self.check(
                &format!("{at}.for_each.{key}"),
                Limit::ListItems,
                u64::try_from(*length).ok(),
            )?;
        }
        let product = lists
            .iter()
            .try_fold(1u64, |acc, (_, n)| acc.checked_mul(u64::try_from(*n).ok()?));
        self.check(&format!("{at}.for_each"), Limit::StepInstances, product)?;
        Ok(product.unwrap_or(u64::MAX))
    }

    /// Adds one step's instances to the workflow's tasks so far, refusing
    /// a total over the limit.
    pub fn add_tasks(&self, total: u64, instances: u64) -> Result<u64, TemplateError> {
        let sum = total.checked_add(instances);
        self.check("steps", Limit::WorkflowTasks, sum)?;
        Ok(sum.unwrap_or(u64::MAX))
    }

    /// Refuses a list input (each top-level input that is a list) with
    /// more items than [`Limits::max_list_items`].
    pub fn check_list_input(&self, field: &str, value: &Value) -> Result<(), TemplateError> {
        match value {
            Value::Array(items) => {
                self.check(field, Limit::ListItems, u64::try_from(items.len()).ok())
            }
            _ => Ok(()),
        }
    }
}

/// The most instance pairs matched for dependencies in one workflow: each
/// instance of a step against each instance of a step it depends on. Fixed,
/// not a setting: it bounds the time and the edges of a plan whose counts
/// are within the other limits (two steps of 1,000 instances that share no
/// `for_each` key make a million edges).
pub const MAX_DEPENDENCY_PAIRS: u64 = 5_000_000;

/// Adds one dependency's instance pairs (`None`: overflowed) to the
/// workflow's so far, refusing a total over [`MAX_DEPENDENCY_PAIRS`].
pub fn check_dependency_pairs(
    field: &str,
    total: u64,
    pairs: Option<u64>,
) -> Result<u64, TemplateError> {
    match pairs.and_then(|p| total.checked_add(p)) {
        Some(sum) if sum <= MAX_DEPENDENCY_PAIRS => Ok(sum),
        sum => Err(err(
            field,
            format!(
                "{} instance pairs to match for dependencies exceed the limit of {MAX_DEPENDENCY_PAIRS} per workflow",
                sum.map_or_else(|| format!("more than {}", u64::MAX), |n| n.to_string())
            ),
        )),
    }
}

/// The longest `when:` expression, in bytes. Fixed, not a setting: a
/// condition compares a few values, and its evaluation costs at most one
/// step per part.
pub const MAX_CONDITION_BYTES: usize = 1024;

/// The most parts (values, paths, operators) of one `when:` expression.
pub const MAX_CONDITION_NODES: usize = 256;

/// The deepest nesting (parentheses, lists, `!` and `-`) of one `when:`
/// expression: the parser and the evaluator recurse once per level.
pub const MAX_CONDITION_DEPTH: usize = 32;

/// The length of `value` as compact JSON, without building the text.
pub fn json_size(value: &impl serde::Serialize) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(bytes.len() as u64);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter can not fail, and a value that does not
    // serialize is refused elsewhere: its size is what was counted.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Webhook subscriptions a service keeps (`POST /webhooks`).
pub const MAX_WEBHOOK_SUBSCRIPTIONS: usize = 100;
/// Event types one subscription names.
pub const MAX_WEBHOOK_EVENT_TYPES: usize = 16;
/// A subscription's target URL, in characters.
pub const MAX_WEBHOOK_URL_CHARS: usize = 2048;
/// A subscription's body template, as compact JSON.
pub const MAX_WEBHOOK_TEMPLATE_BYTES: usize = 16 * 1024;
/// A subscription's description, in characters.
pub const MAX_WEBHOOK_DESCRIPTION_CHARS: usize = 1024;
/// Attempts a delivery's log keeps (the newest); a round of attempts is
/// bounded by the service's `--webhook-max-attempts`.
pub const MAX_LOGGED_DELIVERY_ATTEMPTS: usize = 50;
/// The most `--webhook-max-attempts` may be.
pub const MAX_WEBHOOK_ATTEMPTS: u32 = 30;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> Limits {
        Limits {
            max_step_instances: 1_000,
            max_workflow_tasks: 2_000,
            max_template_steps: 10,
            max_list_items: 1_000,
            max_template_bytes: 100,
            max_input_bytes: 100,
        }
    }

    /// Each case: the `for_each` list lengths of the steps of one
    /// template, and `Ok(total tasks)` or `Err((field, message part))`.
    fn check(steps: &[&[usize]], expected: Result<u64, (&str, &str)>) {
        let limits = limits();
        let counted = (|| {
            let mut total = 0;
            for (i, lengths) in steps.iter().enumerate() {
                let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
                let lists: Vec<(&str, usize)> =
                    keys.iter().copied().zip(lengths.iter().copied()).collect();
                let instances = limits.step_instances(&format!("steps.s{i}"), &lists)?;
                total = limits.add_tasks(total, instances)?;
            }
            Ok::<_, TemplateError>(total)
        })();
        match (counted, expected) {
            (Ok(total), Ok(want)) => assert_eq!(total, want, "{steps:?}"),
            (Err(e), Err((field, part))) => {
                assert_eq!(e.field, field, "{steps:?}: {e}");
                assert!(e.message.contains(part), "{steps:?}: `{e}` lacks `{part}`");
            }
            (got, want) => panic!("{steps:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn counts_instances_and_tasks_before_anything_is_built() {
        // A step without for_each is one instance.
        check(&[&[]], Ok(1));
        check(&[&[], &[3], &[2, 5]], Ok(1 + 3 + 10));
        // An empty list: no instance at all.
        check(&[&[0, 1000]], Ok(0));
        // At the limit, and one past it.
        check(&[&[10, 10, 10]], Ok(1000));
        check(
            &[&[10, 10, 11]],
            Err((
                "steps.s0.for_each",
                "1100 instances exceed the limit of 1000 per step (--max-step-instances)",
            )),
        );
        // Three lists of 300: 27 million instances, refused by counting.
        check(
            &[&[300, 300, 300]],
            Err((
                "steps.s0.for_each",
                "27000000 instances exceed the limit of 1000",
            )),
        );
        // A product past u64 is refused, not wrapped into a small number.
        check(
            &[&[1000, 1000, 1000, 1000, 1000, 1000, 1000]],
            Err((
                "steps.s0.for_each",
                "more than 18446744073709551615 instances exceed the limit",
            )),
        );
        // One list too long, whatever the product.
        check(
            &[&[2, 1001]],
            Err((
                "steps.s0.for_each.b",
                "1001 items exceed the limit of 1000 per list (--max-list-items)",
            )),
        );
        // Each step allowed, the workflow not.
        check(
            &[&[1000], &[1000], &[1]],
            Err((
                "steps",
                "2001 tasks exceed the limit of 2000 per workflow (--max-workflow-tasks)",
            )),
        );
    }

    #[test]
    fn a_product_that_overflows_is_named_as_such() {
        let limits = Limits {
            max_list_items: u64::MAX,
            max_step_instances: u64::MAX,
            ..limits()
        };
        let huge = usize::MAX;
        let e = limits
            .step_instances("steps.s", &[("a", huge), ("b", 2)])
            .unwrap_err();
        assert_eq!(e.field, "steps.s.for_each");
        assert!(
            e.message
                .starts_with("more than 18446744073709551615 instances"),
            "{e}"
        );
        // A sum of tasks past u64, too.
        assert!(limits.add_tasks(u64::MAX, 1).is_err());
    }

    #[test]
    fn dependency_pairs_are_bounded() {
        assert_eq!(
            check_dependency_pairs("s", 0, Some(1_000_000)),
            Ok(1_000_000)
        );
        assert_eq!(
            check_dependency_pairs("s", 4_000_000, Some(1_000_000)),
            Ok(MAX_DEPENDENCY_PAIRS)
        );
        let e =
            check_dependency_pairs("steps.b.depends_on", 4_000_000, Some(1_000_001)).unwrap_err();
        assert_eq!(e.field, "steps.b.depends_on");
        assert!(e.message.starts_with("5000001 instance pairs"), "{e}");
        assert!(check_dependency_pairs("s", 0, None).is_err());
    }

    #[test]
    fn list_inputs_and_sizes_are_counted() {
        let limits = limits();
        assert!(limits.check_list_input("vars.x", &json!([1, 2])).is_ok());
        assert!(
            limits
                .check_list_input("vars.x", &json!("not a list"))
                .is_ok()
        );
        let e = limits
            .check_list_input("vars.servers", &json!(vec![0; 1001]))
            .unwrap_err();
        assert_eq!(e.field, "vars.servers");
        assert!(e.message.contains("--max-list-items"), "{e}");
        assert_eq!(
            json_size(&json!({"a": [1, 2]})),
            r#"{"a":[1,2]}"#.len() as u64
        );
    }
}
