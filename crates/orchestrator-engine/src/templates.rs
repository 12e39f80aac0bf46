//! The template catalogue: the built-in templates compiled into the binary,
//! plus every `.yaml`, `.yml` or `.json` file of the templates dir, each
//! validated (scripts included) when the service starts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use orchestrator_core::template::{Template, TemplateError};

use crate::{Error, Result};

/// (file name, text) of the built-in templates.
const BUILT_IN: [(&str, &str); 3] = [
    (
        "servers-create.yaml",
        include_str!("../../../templates/servers-create.yaml"),
    ),
    (
        "taskserv-create.yaml",
        include_str!("../../../templates/taskserv-create.yaml"),
    ),
    (
        "cluster-create.yaml",
        include_str!("../../../templates/cluster-create.yaml"),
    ),
];

/// Templates by `ref_name`, then by `schema_version`.
#[derive(Debug, Clone, Default)]
pub struct Templates {
    by_ref: BTreeMap<String, BTreeMap<u32, Arc<Template>>>,
}

impl Templates {
    /// The built-ins, then the files of `dir` (a missing dir is fine: the
    /// built-ins still serve). A file may replace a built-in of the same
    /// `ref_name` and `schema_version`. Any invalid file stops the start,
    /// naming the file and the field.
    pub fn load(dir: Option<&Path>, steps: &crate::steps::Steps) -> Result<Templates> {
        let mut templates = Templates::default();
        for (file, text) in BUILT_IN {
            // Their scripts are checked when they are used: a service whose
            // scripts dir lacks the provisioning scripts still serves the rest.
            let template = Template::parse(text, false).map_err(|e| file_error(file, e))?;
            template
                .validate(steps.kinds())
                .map_err(|e| file_error(file, e))?;
            templates.insert(template);
        }
        let Some(dir) = dir.filter(|d| d.exists()) else {
            return Ok(templates);
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| {
                Error::validation(
                    "--templates-dir",
                    format!("cannot read {}: {e}", dir.display()),
                )
            })?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
            .collect();
        files.sort();
        for path in files {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::validation(&name, format!("cannot read: {e}")))?;
            if BUILT_IN.iter().any(|(_, builtin)| *builtin == text) {
                // The shipped copy of a built-in: already loaded.
                continue;
            }
            let is_json = path.extension().is_some_and(|e| e == "json");
            let template = Template::parse(&text, is_json).map_err(|e| file_error(&name, e))?;
            templates
                .add(template, steps)
                .map_err(|e| file_error(&name, e))?;
        }
        Ok(templates)
    }

    fn add(
        &mut self,
        template: Template,
        steps: &crate::steps::Steps,
    ) -> Result<(), TemplateError> {
        check(&template, steps)?;
        self.insert(template);
        Ok(())
    }

    fn insert(&mut self, template: Template) {
        self.by_ref
            .entry(template.ref_name.clone())
            .or_default()
            .insert(template.schema_version, Arc::new(template));
    }

    /// A template by name; the newest `schema_version` unless one is asked for.
    pub fn get(&self, ref_name: &str, version: Option<u32>) -> Option<Arc<Template>> {
        let versions = self.by_ref.get(ref_name)?;
        match version {
            Some(v) => versions.get(&v).cloned(),
            None => versions.values().next_back().cloned(),
        }
    }

    /// Every template, every version.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Template>> {
        self.by_ref.values().flat_map(|versions| versions.values())
    }
}

/// Everything about a template that can be checked without inputs,
/// scripts included.
pub fn check(template: &Template, steps: &crate::steps::Steps) -> Result<(), TemplateError> {
    template.validate(steps.kinds())?;
    for step in &template.steps {
        steps
            .check(step.kind, &step.script)
            .map_err(|message| TemplateError {
                field: format!("steps.{}.script", step.ref_name),
                message,
            })?;
        steps
            .check_input(step.kind, &step.input_value())
            .map_err(|refusal| {
                input_refusal(&step.ref_name, steps.input_field(step.kind), refusal)
            })?;
        if let Some(rollback) = &step.rollback {
            // An undo is a script, whatever the step's kind.
            steps
                .check(orchestrator_core::StepKind::script(), rollback)
                .map_err(|message| TemplateError {
                    field: format!("steps.{}.rollback", step.ref_name),
                    message,
                })?;
        }
    }
    Ok(())
}

/// A runner's refusal of a step's input, as the template's error: the
/// field the input comes from (`input`, `http`) and the path inside it.
pub(crate) fn input_refusal(
    ref_name: &str,
    input_field: &str,
    refusal: orchestrator_executor::InputRefusal,
) -> TemplateError {
    TemplateError {
        field: format!("steps.{ref_name}.{input_field}{}", refusal.at),
        message: refusal.message,
    }
}

fn file_error(file: &str, e: TemplateError) -> Error {
    Error::validation(format!("template {file}: {}", e.field), e.message)
}
