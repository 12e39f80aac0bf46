//! `orchestrator approvals`, `approve` and `reject`: approval gates
//! through the API's typed client.

use orchestrator_api::client::{Decision, PendingApproval};

use crate::cli::{ApprovalsArgs, ClientArgs, DecideArgs};
use crate::client::{connect, print_json, print_table, shown};

pub async fn list(client: &ClientArgs, args: ApprovalsArgs) -> anyhow::Result<()> {
    let list = connect(client)?.approvals().await?;
    if args.json {
        return print_json(&list);
    }
    let rows: Vec<[String; 6]> = list
        .items
        .iter()
        .map(|gate| {
            [
                shown(&gate.workflow_id),
                gate.step.clone(),
                format!("{}/{}", gate.approvals.len(), gate.required),
                shown(&gate.deadline),
                gate.workflow_name.clone(),
                gate.digest.clone(),
            ]
        })
        .collect();
    print_table(
        [
            "WORKFLOW",
            "STEP",
            "APPROVALS",
            "DEADLINE",
            "NAME",
            "DIGEST",
        ],
        &rows,
    );
    Ok(())
}

/// What a decision signs: the digest and its parts.
fn describe(gate: &PendingApproval) {
    println!(
        "gate {} of workflow {} ({}): digest {}",
        gate.step,
        shown(&gate.workflow_id),
        gate.workflow_name,
        gate.digest
    );
    println!("  inputs    sha256:{}", gate.covers.inputs);
    println!("  template  {}", gate.covers.template);
    for (path, hash) in &gate.covers.scripts {
        println!("  script    {path} sha256:{hash}");
    }
    for (step, hash) in &gate.covers.outputs {
        println!("  output    {step} sha256:{hash}");
    }
}

pub async fn decide(client: &ClientArgs, args: DecideArgs, approve: bool) -> anyhow::Result<()> {
    let api = connect(client)?;
    let digest = match args.digest {
        Some(digest) => digest,
        None => {
            let gate = api
                .workflow_approval(&args.workflow, args.step.as_deref())
                .await?;
            if !args.json {
                describe(&gate);
            }
            gate.digest
        }
    };
    let decision = Decision {
        digest,
        comment: args.comment,
        step: args.step,
    };
    let outcome = api
        .decide_workflow(&args.workflow, approve, &decision)
        .await?;
    if args.json {
        return print_json(&outcome);
    }
    println!(
        "{} gate {} of workflow {}: {} ({} of {} approvals)",
        if approve { "approved" } else { "rejected" },
        outcome.step,
        shown(&outcome.workflow_id),
        outcome.status,
        outcome.approvals,
        outcome.required
    );
    Ok(())
}
