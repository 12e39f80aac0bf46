//! DAG planning without I/O: parsing, every validation error, expansion.

use serde_json::{Value, json};

use super::*;

const CLUSTER: &str = r#"
name: Cluster
ref_name: cluster
schema_version: 1
inputs:
  servers: {type: array}
  taskservs: {type: array, default: []}
  cluster: {type: string}
  size: {type: integer, default: 2}
steps:
  - ref_name: server
    name: create ${each.server}
    script: servers/create.nu
    for_each: {server: "${workflow.input.servers}"}
    input: {server: "${each.server}", size: "${workflow.input.size}"}
  - ref_name: install
    script: taskservs/install.nu
    for_each: {server: "${workflow.input.servers}", taskserv: "${workflow.input.taskservs}"}
    sequential: taskserv
    depends_on: [server]
    input: {server: "${each.server}", taskserv: "${each.taskserv}", ip: "${server.output.ip}"}
  - ref_name: join
    script: cluster/create.nu
    depends_on: [install]
    retries: 2
    timeout: 5m
    input: {cluster: "${workflow.input.cluster}", ips: "${server.output.ip}"}
"#;

fn template(text: &str) -> Template {
    Template::parse(text, false).unwrap()
}

/// The kinds of the service's templates: scripts, http steps and a kind
/// that takes `input` as scripts do.
fn kinds() -> StepKinds {
    StepKinds::new()
        .with(StepKind::script(), StepInput::Input)
        .with(kind("http"), StepInput::Http)
        .with(kind("testenv"), StepInput::Input)
}

fn kind(name: &str) -> StepKind {
    StepKind::new(name).unwrap()
}

fn vars(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[test]
fn expands_for_each_steps_with_matching_and_sequential_dependencies() {
    let t = template(CLUSTER);
    let e = t
        .expand(
            &kinds(),
            &vars(
                json!({"servers": ["a", "b"], "taskservs": ["containerd", "k8s"], "cluster": "c1"}),
            ),
            false,
            &Limits::default(),
        )
        .unwrap();
    let names: Vec<&str> = e.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "create a",
            "create b",
            "install [server=a, taskserv=containerd]",
            "install [server=a, taskserv=k8s]",
            "install [server=b, taskserv=containerd]",
            "install [server=b, taskserv=k8s]",
            "join"
        ]
    );
    assert_eq!(e.tasks[2].depends_on, vec![0]);
    assert_eq!(
        e.tasks[3].depends_on,
        vec![0, 2],
        "same server, previous taskserv"
    );
    assert_eq!(e.tasks[5].depends_on, vec![1, 4]);
    // join names `install` explicitly and `server` through its input.
    assert_eq!(e.tasks[6].depends_on, vec![2, 3, 4, 5, 0, 1]);
    assert_eq!(e.tasks[6].max_attempts, Some(3));
    assert_eq!(e.tasks[6].timeout, Some(Duration::from_secs(300)));
    // Inputs without output references are final, with their JSON types.
    assert_eq!(e.tasks[0].input, json!({"server": "a", "size": 2}));
    // Inputs with them wait for release.
    assert_eq!(e.tasks[2].input, Value::Null);
    assert!(e.tasks[2].step.input_template.is_some());
    assert_eq!(
        e.tasks[2].step.each,
        Some(json!({"server": "a", "taskserv": "containerd"}))
    );
    assert_eq!(
        e.vars,
        json!({"servers": ["a", "b"], "taskservs": ["containerd", "k8s"], "cluster": "c1", "size": 2})
    );
    assert_eq!(e.step_order, ["server", "install", "join"]);
}

#[test]
fn an_empty_list_gives_no_instances_and_dependents_still_plan() {
    let e = template(CLUSTER)
        .expand(
            &kinds(),
            &vars(json!({"servers": ["a"], "cluster": "c"})),
            false,
            &Limits::default(),
        )
        .unwrap();
    let names: Vec<&str> = e.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["create a", "join"]);
    assert_eq!(e.tasks[1].depends_on, vec![0]);
}

#[test]
fn per_step_vars_override_the_template_input() {
    let e = template(CLUSTER)
        .expand(&kinds(), &vars(json!({"servers": ["a"], "cluster": "c", "steps": {"server": {"size": 9, "zone": "z"}}})), false, &Limits::default())
        .unwrap();
    assert_eq!(
        e.tasks[0].input,
        json!({"server": "a", "size": 9, "zone": "z"})
    );
}

#[track_caller]
fn check_invalid(text: &str, vars_value: Value, field: &str, mentions: &str) {
    let result = Template::parse(text, false)
        .and_then(|t| t.expand(&kinds(), &vars(vars_value), false, &Limits::default()));
    match result {
        Err(e) => {
            assert_eq!(e.field, field, "{e}");
            assert!(
                e.message.contains(mentions),
                "`{}` should mention `{mentions}`",
                e.message
            );
        }
        Ok(_) => panic!("expected {field} to be refused"),
    }
}

fn one_step(step: &str) -> String {
    format!(
        "name: t\nref_name: t\nschema_version: 1\ninputs:\n  x: {{type: string, default: a}}\nsteps:\n{step}"
    )
}

#[test]
fn cycles_are_named() {
    let text = "name: t\nref_name: t\nschema_version: 1\nsteps:\n\
        - {ref_name: a, script: s.sh, depends_on: [c]}\n\
        - {ref_name: b, script: s.sh, input: {v: '${a.output.v}'}}\n\
        - {ref_name: c, script: s.sh, depends_on: [b]}\n";
    check_invalid(text, json!({}), "steps.a.depends_on", "a -> c -> b -> a");
}

#[test]
fn every_validation_error_names_the_step_and_field() {
    let dup = "name: t\nref_name: t\nschema_version: 1\nsteps:\n- {ref_name: a, script: s.sh}\n- {ref_name: a, script: s.sh}\n";
    check_invalid(dup, json!({}), "steps[1].ref_name", "used by another step");
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, depends_on: [zz]}"),
        json!({}),
        "steps.a.depends_on[0]",
        "`zz`",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, depends_on: [a]}"),
        json!({}),
        "steps.a.depends_on[0]",
        "itself",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, input: {v: '${zz.output.ip}'}}"),
        json!({}),
        "steps.a.input.v",
        "`zz`",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, input: {v: '${workflow.input.nope}'}}"),
        json!({}),
        "steps.a.input.v",
        "`nope`",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, input: {v: '${each.server}'}}"),
        json!({}),
        "steps.a.input.v",
        "for_each",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, input: {v: '${bogus}'}}"),
        json!({}),
        "steps.a.input.v",
        "bogus",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, timeout: 5y}"),
        json!({}),
        "steps.a.timeout",
        "unit",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, sequential: k}"),
        json!({}),
        "steps.a.sequential",
        "`k`",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, for_each: {k: '${workflow.input.x}'}}"),
        json!({}),
        "steps.a.for_each.k",
        "must be a list",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh, scirpt: x}"),
        json!({}),
        "template",
        "scirpt",
    );
    check_invalid(
        &one_step("- {ref_name: 'a b', script: s.sh}"),
        json!({}),
        "steps[0].ref_name",
        "a b",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh}"),
        json!({"y": 1}),
        "vars.y",
        "no input `y`",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh}"),
        json!({"x": 5}),
        "vars.x",
        "expected a string, got a number",
    );
    check_invalid(
        &one_step("- {ref_name: a, script: s.sh}"),
        json!({"steps": {"b": {}}}),
        "vars.steps.b",
        "no step",
    );
    let required = "name: t\nref_name: t\nschema_version: 1\ninputs:\n  need: {type: string}\nsteps:\n- {ref_name: a, script: s.sh}\n";
    check_invalid(required, json!({}), "vars.need", "missing required input");
    let bad_default = "name: t\nref_name: t\nschema_version: 1\ninputs:\n  n: {type: integer, default: x}\nsteps:\n- {ref_name: a, script: s.sh}\n";
    check_invalid(bad_default, json!({}), "inputs.n.default", "integer");
    check_invalid(
        "name: t\nref_name: t\nschema_version: 1\nsteps: []\n",
        json!({}),
        "steps",
        "at least one step",
    );
    check_invalid(
        "name: t\nref_name: t\nschema_version: 0\nsteps: [{ref_name: a, script: s}]\n",
        json!({}),
        "schema_version",
        "at least 1",
    );
}

#[test]
fn optional_null_inputs_are_allowed() {
    let text = "name: t\nref_name: t\nschema_version: 1\ninputs:\n  s: {type: string, default: null}\nsteps:\n- {ref_name: a, script: s.sh, input: {s: '${workflow.input.s}'}}\n";
    let e = template(text)
        .expand(&kinds(), &Map::new(), false, &Limits::default())
        .unwrap();
    assert_eq!(e.tasks[0].input, json!({"s": null}));
}

#[test]
fn json_templates_parse_too() {
    let text = r#"{"name": "t", "ref_name": "t", "schema_version": 2, "steps": [{"ref_name": "a", "script": "s.sh", "input": {"c": "${workflow.check_mode}"}}]}"#;
    let e = Template::parse(text, true)
        .unwrap()
        .expand(&kinds(), &Map::new(), true, &Limits::default())
        .unwrap();
    assert_eq!(e.tasks[0].input, json!({"c": true}));
}

#[test]
fn per_step_vars_are_literal_data() {
    let e = template(CLUSTER)
        .expand(&kinds(), &vars(json!({"servers": ["a"], "cluster": "c", "steps": {"server": {"note": "${join.output}", "cost": "$${x}"}}})), false, &Limits::default())
        .unwrap();
    assert_eq!(e.tasks[0].input["note"], json!("${join.output}"));
    assert_eq!(e.tasks[0].input["cost"], json!("$${x}"));
    assert_eq!(
        e.tasks[0].depends_on,
        Vec::<usize>::new(),
        "no dependency was added"
    );
}

#[test]
fn name_format_inputs_refuse_unsafe_names() {
    let text = "name: t\nref_name: t\nschema_version: 1\ninputs:\n  infra: {type: string, format: name}\n  hosts: {type: array, format: name}\nsteps:\n- {ref_name: a, script: s.sh}\n";
    let t = template(text);
    assert!(
        t.expand(
            &kinds(),
            &vars(json!({"infra": "prod", "hosts": ["a-1", "b.2"]})),
            false,
            &Limits::default(),
        )
        .is_ok()
    );
    let e = t
        .expand(
            &kinds(),
            &vars(json!({"infra": "../etc", "hosts": []})),
            false,
            &Limits::default(),
        )
        .unwrap_err();
    assert_eq!(e.field, "vars.infra");
    let e = t
        .expand(
            &kinds(),
            &vars(json!({"infra": "p", "hosts": ["ok", "a/b"]})),
            false,
            &Limits::default(),
        )
        .unwrap_err();
    assert_eq!(e.field, "vars.hosts[1]");
}

#[test]
fn a_step_names_its_kind_and_script_is_the_default() {
    let plain = template(CLUSTER);
    assert!(plain.steps.iter().all(|s| s.kind == StepKind::script()));
    let explicit = template(
        "name: t\nref_name: t\nschema_version: 1\nsteps:\n  - {ref_name: a, kind: script, script: a.sh}\n",
    );
    let expansion = explicit
        .expand(&kinds(), &Map::new(), false, &Limits::default())
        .unwrap();
    assert_eq!(expansion.tasks[0].step.kind, StepKind::script());
    // The default is not written out, so stored tasks read as before.
    let stored = serde_json::to_value(&expansion.tasks[0].step).unwrap();
    assert!(stored.get("kind").is_none(), "{stored}");
    // A kind the service does not run is refused by name, with the kinds
    // it runs.
    let unknown = template(
        "name: t\nref_name: t\nschema_version: 1\nsteps:\n  - {ref_name: a, kind: teleport, script: a.sh}\n",
    )
    .validate(&kinds())
    .unwrap_err();
    assert_eq!(unknown.field, "steps.a.kind");
    assert_eq!(
        unknown.message,
        "unknown step kind `teleport` (expected one of script, http, testenv)"
    );
    // A name that could be no kind at all is a parse error.
    let malformed = Template::parse(
        "name: t\nref_name: t\nschema_version: 1\nsteps:\n  - {ref_name: a, kind: Tele port, script: a.sh}\n",
        false,
    )
    .unwrap_err();
    assert!(malformed.message.contains("`Tele port`"), "{malformed}");
}

/// A kind is written as its name, as when kinds were an enum: stored
/// tasks and templates read and write the same text.
#[test]
fn a_step_kind_reads_and_writes_its_name() {
    let settings: crate::StepSettings =
        serde_json::from_value(json!({"kind": "testenv", "ref_name": "a"})).unwrap();
    assert_eq!(settings.kind, kind("testenv"));
    assert_eq!(
        serde_json::to_value(&settings).unwrap(),
        json!({"kind": "testenv", "ref_name": "a"})
    );
    assert_eq!(
        serde_json::to_value(crate::StepSettings::default()).unwrap(),
        json!({})
    );
    for bad in [
        "",
        "Script",
        "1st",
        "a b",
        &"x".repeat(StepKind::MAX_LEN + 1),
    ] {
        assert!(StepKind::new(bad).is_err(), "{bad:?}");
    }
    assert!(StepKind::new(&"x".repeat(StepKind::MAX_LEN)).is_ok());
}

const HTTP: &str = r#"
name: Remote job
ref_name: remote
schema_version: 1
inputs:
  base: {type: string}
  vars: {type: object, default: {}}
steps:
  - ref_name: prepare
    script: prepare.sh
  - ref_name: awx
    kind: http
    http:
      headers: {Authorization: "Bearer ${secrets.awx_token}"}
      launch:
        url: ${workflow.input.base}/api/v2/job_templates/7/launch/
        body: {extra_vars: "${workflow.input.vars}", ticket: "${prepare.output.ticket}"}
      job_id: /job
      poll:
        url: ${workflow.input.base}/api/v2/jobs/${job.id}/
        interval: 250ms
        status: /status
        status_map: {success: [successful], running: [pending, running], failure: [failed]}
      outputs: {artifacts: /artifacts}
      cancel: {url: "${workflow.input.base}/api/v2/jobs/${job.id}/cancel/"}
"#;

/// `HTTP` with its `awx` step changed by `edit` (a YAML line replaced).
fn http_with(from: &str, to: &str) -> String {
    assert!(HTTP.contains(from), "{from}");
    HTTP.replace(from, to)
}

#[test]
fn an_http_step_plans_its_block_as_the_task_input() {
    let t = template(HTTP);
    assert_eq!(t.steps[1].kind, kind("http"));
    let e = t
        .expand(
            &kinds(),
            &vars(json!({"base": "http://awx.test"})),
            false,
            &Limits::default(),
        )
        .unwrap();
    let task = &e.tasks[1];
    assert_eq!(task.script, "http:awx");
    assert_eq!(task.step.kind, kind("http"));
    // It reads `prepare`'s output: resolved at release, like a script's input.
    assert_eq!(task.depends_on, vec![0]);
    assert_eq!(task.input, Value::Null);
    let block = task.step.input_template.as_ref().unwrap();
    assert_eq!(block["job_id"], "/job");
    assert_eq!(
        block["poll"]["url"],
        "${workflow.input.base}/api/v2/jobs/${job.id}/"
    );

    // Without step outputs it resolves at submission; secrets and the job
    // id stay references, to be put in when the step runs.
    let t = template(&http_with(", ticket: \"${prepare.output.ticket}\"", ""));
    let e = t
        .expand(
            &kinds(),
            &vars(json!({"base": "http://awx.test", "vars": {"n": 1}})),
            false,
            &Limits::default(),
        )
        .unwrap();
    let input = &e.tasks[1].input;
    assert_eq!(
        input["launch"]["url"],
        "http://awx.test/api/v2/job_templates/7/launch/"
    );
    assert_eq!(input["launch"]["body"]["extra_vars"], json!({"n": 1}));
    assert_eq!(
        input["headers"]["Authorization"],
        "Bearer ${secrets.awx_token}"
    );
    assert_eq!(
        input["poll"]["url"],
        "http://awx.test/api/v2/jobs/${job.id}/"
    );
    let back: crate::template::http::HttpStep = serde_json::from_value(input.clone()).unwrap();
    assert_eq!(back.outputs["artifacts"], "/artifacts");
}

#[test]
fn an_http_step_is_refused_with_the_field_at_fault() {
    let cases = [
        (
            http_with(
                "url: ${workflow.input.base}/api/v2/job_templates/7/launch/",
                "url: ${workflow.input.base}/${job.id}",
            ),
            "steps.awx.http.launch.url",
            "poll and cancel",
        ),
        (
            http_with("job_id: /job", "job_id: /${workflow.input.base}"),
            "steps.awx.http.job_id",
            "url, headers and body",
        ),
        (
            http_with("status: /status", "status: status"),
            "steps.awx.http.poll.status",
            "JSON pointer",
        ),
        (
            http_with("    kind: http\n", "    kind: http\n    script: x.sh\n"),
            "steps.awx.script",
            "no script",
        ),
        (
            http_with("    kind: http\n", "    kind: http\n    input: {a: 1}\n"),
            "steps.awx.input",
            "no input",
        ),
        (
            http_with("    kind: http\n", ""),
            "steps.awx.http",
            "kind: http",
        ),
        (
            "name: t\nref_name: t\nschema_version: 1\nsteps:\n- {ref_name: a, kind: http}\n"
                .to_owned(),
            "steps.a.http",
            "needs an http block",
        ),
        (
            "name: t\nref_name: t\nschema_version: 1\nsteps:\n- {ref_name: a}\n".to_owned(),
            "steps.a.script",
            "must name a script",
        ),
        (
            one_step("- {ref_name: a, script: s.sh, input: {v: '${job.id}'}}"),
            "steps.a.input.v",
            "poll and cancel",
        ),
    ];
    for (text, field, mentions) in cases {
        check_invalid(&text, json!({"base": "http://x"}), field, mentions);
    }
    check_invalid(
        HTTP,
        json!({"base": "http://x", "steps": {"awx": {"a": 1}}}),
        "vars.steps.awx",
        "no per-step input",
    );
}

/// Each place in the order goes to the first step, in template order,
/// whose dependencies are all placed: the order users see in plans and
/// the order tasks are stored in.
#[test]
fn the_step_order_takes_the_first_ready_step_in_template_order() {
    let text = "name: t\nref_name: t\nschema_version: 1\nsteps:\n\
        - {ref_name: d, script: s.sh, depends_on: [c, a]}\n\
        - {ref_name: c, script: s.sh, depends_on: [b]}\n\
        - {ref_name: b, script: s.sh}\n\
        - {ref_name: a, script: s.sh}\n\
        - {ref_name: e, script: s.sh, depends_on: [b, b]}\n";
    let template: Template = serde_norway::from_str(text).unwrap();
    assert_eq!(
        template.validate(&kinds()).unwrap(),
        ["b", "c", "a", "d", "e"]
    );
}

/// A step over three lists: what the limits are tried with.
const THREE_LISTS: &str = "name: t\nref_name: t\nschema_version: 1\ninputs:\n  a: {type: array}\n  b: {type: array}\n  c: {type: array}\nsteps:\n- {ref_name: deploy, script: s.sh, for_each: {a: '${workflow.input.a}', b: '${workflow.input.b}', c: '${workflow.input.c}'}}\n";

#[test]
fn an_expansion_over_a_limit_is_refused_naming_it() {
    let list: Vec<u32> = (0..300).collect();
    check_invalid(
        THREE_LISTS,
        json!({"a": list, "b": list, "c": list}),
        "steps.deploy.for_each",
        "27000000 instances exceed the limit of 1000 per step (--max-step-instances)",
    );
    let long: Vec<u32> = (0..1001).collect();
    check_invalid(
        THREE_LISTS,
        json!({"a": long, "b": [1], "c": [1]}),
        "vars.a",
        "1001 items exceed the limit of 1000 per list (--max-list-items)",
    );
    let ten: Vec<u32> = (0..10).collect();
    let e = template(THREE_LISTS)
        .expand(
            &kinds(),
            &vars(json!({"a": ten, "b": ten, "c": ten})),
            false,
            &Limits::default(),
        )
        .unwrap();
    assert_eq!(e.tasks.len(), 1000, "the limit itself is allowed");
}

#[test]
fn a_template_with_too_many_steps_is_refused() {
    let limits = Limits {
        max_template_steps: 1,
        ..Limits::default()
    };
    let e = template(CLUSTER)
        .expand(
            &kinds(),
            &vars(json!({"servers": ["a"], "taskservs": ["k"], "cluster": "c"})),
            false,
            &limits,
        )
        .unwrap_err();
    assert_eq!(e.field, "steps");
    assert!(e.message.contains("--max-template-steps"), "{e}");
}

#[test]
fn numbers_out_of_range_are_refused_naming_the_field() {
    let step = |extra: Value| {
        let mut step = json!({"ref_name": "a", "script": "s.sh"});
        step.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"name": "t", "ref_name": "t", "schema_version": 1, "steps": [step]})
    };
    let cases = [
        (
            step(json!({"timeout": u64::MAX})),
            "steps.a.timeout",
            "longer than the maximum",
        ),
        (
            step(json!({"timeout": "9999999999999999999h"})),
            "steps.a.timeout",
            "longer than the maximum",
        ),
        (
            step(json!({"timeout": "31d"})),
            "steps.a.timeout",
            "unknown unit",
        ),
        (
            step(json!({"timeout": 2_592_001})),
            "steps.a.timeout",
            "2592000 seconds",
        ),
        (
            step(json!({"retries": 100})),
            "steps.a.retries",
            "from 0 to 99",
        ),
        (
            json!({"name": "t", "ref_name": "t", "schema_version": 1, "parallel_limit": 100_001u64, "steps": [{"ref_name": "a", "script": "s.sh"}]}),
            "parallel_limit",
            "from 1 to 100000",
        ),
    ];
    for (template, field, mentions) in cases {
        let e = Template::parse(&template.to_string(), true)
            .and_then(|t| t.validate(&kinds()))
            .unwrap_err();
        assert_eq!(e.field, field, "{template}: {e}");
        assert!(
            e.message.contains(mentions),
            "{template}: `{e}` lacks `{mentions}`"
        );
    }
    // At the bound: allowed.
    assert!(parse_timeout(&json!(2_592_000)).is_ok());
    assert!(parse_timeout(&json!("720h")).is_ok());
}

#[test]
fn dependency_pairs_past_their_limit_are_refused_before_any_edge_is_made() {
    // `a` over one list, six steps over another that each depend on `a`:
    // a million pairs each, six million in all.
    let mut steps =
        vec![json!({"ref_name": "a", "script": "s.sh", "for_each": {"x": "${workflow.input.xs}"}})];
    for name in ["b", "c", "d", "e", "f", "g"] {
        steps.push(json!({"ref_name": name, "script": "s.sh", "depends_on": ["a"], "for_each": {"y": "${workflow.input.ys}"}}));
    }
    let text = json!({
        "name": "t", "ref_name": "t", "schema_version": 1,
        "inputs": {"xs": {"type": "array"}, "ys": {"type": "array"}},
        "steps": steps,
    });
    let list: Vec<u32> = (0..1000).collect();
    let e = Template::parse(&text.to_string(), true)
        .unwrap()
        .expand(
            &kinds(),
            &vars(json!({"xs": list, "ys": list})),
            false,
            &Limits::default(),
        )
        .unwrap_err();
    assert_eq!(e.field, "steps.g.depends_on", "{e}");
    assert!(
        e.message.contains(
            "6000000 instance pairs to match for dependencies exceed the limit of 5000000"
        ),
        "{e}"
    );
}

const CONDITIONS: &str = r#"
name: Conditions
ref_name: conditions
schema_version: 1
inputs:
  env: {type: string}
steps:
  - ref_name: plan
    script: plan.nu
  - ref_name: other
    script: other.nu
  - ref_name: apply
    script: apply.nu
    depends_on: [plan]
    when: WHEN
"#;

/// The CONDITIONS template with `when` as the apply step's condition.
fn with_when(when: &str) -> Template {
    let text = CONDITIONS.replace("WHEN", &serde_json::to_string(when).unwrap());
    template(&text)
}

#[test]
fn a_condition_is_checked_with_the_step_and_the_column() {
    let ok = with_when("workflow.input.env == 'prod' && plan.output.changes > 0");
    ok.validate(&kinds()).unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "workflow.input.env ==",
            "column 22: expected a value, found the end",
        ),
        (
            "workflow.input.nope == 'x'",
            "column 1: `workflow.input.nope` reads an input the template does not declare in `inputs`",
        ),
        (
            "true && ghost.output.x",
            "column 9: `ghost.output.x` refers to step `ghost`, which does not exist",
        ),
        (
            "other.output.ok",
            "column 1: `other.output.ok`: step `other` is not upstream of step `apply` (name it in depends_on)",
        ),
        (
            "apply.output.ok",
            "column 1: `apply.output.ok`: a step can not use its own output",
        ),
        (
            "each.server == 'a'",
            "column 1: `each.server`: this step has no such for_each key",
        ),
    ];
    for (when, message) in cases {
        let e = with_when(when).validate(&kinds()).unwrap_err();
        assert_eq!(e.field, "steps.apply.when", "{when}: {e}");
        assert_eq!(&e.message, message, "{when}");
    }
}

#[test]
fn a_step_with_a_condition_is_planned_with_it_and_waits_to_be_decided() {
    let t = with_when("workflow.input.env == 'prod'");
    let e = t
        .expand(
            &kinds(),
            &vars(json!({"env": "prod"})),
            false,
            &Limits::default(),
        )
        .unwrap();
    let apply = e.tasks.iter().find(|t| t.name == "apply").unwrap();
    assert_eq!(
        apply.step.when.as_deref(),
        Some("workflow.input.env == 'prod'")
    );
    let plan = e.tasks.iter().find(|t| t.name == "plan").unwrap();
    assert_eq!(plan.step.when, None);
}

const LOCKED: &str = r#"
name: Deploy
ref_name: deploy
schema_version: 1
inputs:
  env: {type: string}
locks:
  env: {name: "env:${workflow.input.env}"}
  db-main: {name: "db", mode: shared, limit: 2, steps: [apply, check]}
steps:
  - ref_name: plan
    script: plan.nu
  - ref_name: apply
    script: apply.nu
    depends_on: [plan]
    input: {fence: "${locks.db-main.token}"}
  - ref_name: check
    script: check.nu
    depends_on: [apply]
"#;

#[test]
fn locks_resolve_per_step_at_submission() {
    let e = template(LOCKED)
        .expand(
            &kinds(),
            &vars(json!({"env": "prod"})),
            false,
            &Limits::default(),
        )
        .unwrap();
    let locks_of = |name: &str| {
        e.tasks
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .step
            .locks
            .iter()
            .map(|c| (c.key.clone(), c.name.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        locks_of("plan"),
        vec![("env".to_owned(), "env:prod".to_owned())]
    );
    assert_eq!(
        locks_of("apply"),
        vec![
            ("db-main".to_owned(), "db".to_owned()),
            ("env".to_owned(), "env:prod".to_owned())
        ]
    );
    // The token stays a reference until the step runs.
    let apply = e.tasks.iter().find(|t| t.name == "apply").unwrap();
    assert_eq!(apply.input["fence"], json!("${locks.db-main.token}"));
}

#[test]
fn bad_locks_are_refused_naming_the_field() {
    let with = |locks: &str| {
        format!(
            "name: t\nref_name: t\nschema_version: 1\ninputs:\n  x: {{type: string, default: a}}\nlocks:\n{locks}\nsteps:\n  - ref_name: s\n    script: s.nu\n"
        )
    };
    check_invalid(
        &with("  l: {name: a, mode: sometimes}"),
        json!({}),
        "template",
        "locks.l.mode",
    );
    check_invalid(
        &with("  l: {name: a, limit: 2}"),
        json!({}),
        "locks.l.limit",
        "only a shared lock",
    );
    check_invalid(
        &with("  l: {name: a, mode: shared, limit: 0}"),
        json!({}),
        "locks.l.limit",
        "out of range",
    );
    check_invalid(
        &with("  l: {name: a, steps: [nope]}"),
        json!({}),
        "locks.l.steps[0]",
        "nope",
    );
    check_invalid(
        &with("  l: {name: \"${workflow.input.y}\"}"),
        json!({}),
        "locks.l.name",
        "declared workflow inputs",
    );
    check_invalid(
        &with("  a-b: {name: a}\n  a_b: {name: b}"),
        json!({}),
        "locks.a_b",
        "ORCHESTRATOR_LOCK_A_B",
    );
    check_invalid(
        &with("  l: {name: \"e ${workflow.input.x}\"}"),
        json!({}),
        "locks.l.name",
        "`e a` is not a lock name",
    );
    check_invalid(
        &with("  l: {name: a}\n  m: {name: a}"),
        json!({}),
        "locks.m.name",
        "also the name of lock `l`",
    );
    let many: String = (0..17)
        .map(|i| format!("  l{i}: {{name: n{i}}}\n"))
        .collect();
    check_invalid(&with(many.trim_end()), json!({}), "locks", "limit of 16");
    check_invalid(
        &one_step("  - ref_name: s\n    script: s.nu\n    input: {t: \"${locks.env.token}\"}"),
        json!({}),
        "steps.s.input.t",
        "holds no lock declared as `env`",
    );
}
