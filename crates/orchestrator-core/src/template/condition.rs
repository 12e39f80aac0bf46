//! `when:` conditions: a small, safe subset of CEL (the Common Expression
//! Language), parsed by hand.
//!
//! Why not a CEL crate: the maintained one (`cel`, formerly
//! `cel-interpreter`) parses through an ANTLR runtime in beta, pulls a
//! dozen crates into the default build, and has no bound on evaluation
//! cost (its macros loop over lists). A condition needs much less: read
//! values, compare them, combine the answers. Every expression of this
//! subset means the same in CEL.
//!
//! The language (see templates.md, "Conditions"):
//!
//! ```text
//! expr    := or
//! or      := and ("||" and)*
//! and     := compare ("&&" compare)*
//! compare := unary (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in") unary)?
//! unary   := "!" unary | "-" unary | path | literal | list | "(" expr ")"
//! path    := name ("." name | "[" (integer | string) "]")*
//! list    := "[" (expr ("," expr)*)? "]"
//! literal := null | true | false | integer | decimal | 'string' | "string"
//! ```
//!
//! A path is a reference, as `${...}` writes it without the braces:
//! `workflow.input.<key>`, `workflow.check_mode`, `each.<key>`,
//! `<step>.output...`. Names may contain `-` (step names do): there is no
//! subtraction. The cost is bounded by the text: an expression has at most
//! [`MAX_CONDITION_BYTES`] bytes, [`MAX_CONDITION_NODES`] nodes and
//! [`MAX_CONDITION_DEPTH`] levels of nesting, and each node is evaluated
//! at most once (no loops, no functions), so evaluation is linear in the
//! nodes times the size of the values they compare.

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Number, Value};

use super::limits::{MAX_CONDITION_BYTES, MAX_CONDITION_DEPTH, MAX_CONDITION_NODES};
use super::value_kind;
use crate::refs::{Reference, Root, Scope, Segment};

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    root: Node,
}

/// Why a condition was refused or could not be evaluated: `column` (from
/// 1, in characters) is where in the expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ConditionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.message)
    }
}

fn error(column: usize, message: impl Into<String>) -> ConditionError {
    ConditionError {
        column,
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    /// Column of its first character (or of its operator).
    column: usize,
    kind: NodeKind,
}

#[derive(Debug, Clone, PartialEq)]
enum NodeKind {
    Literal(Value),
    Path(Reference),
    List(Vec<Node>),
    Not(Box<Node>),
    Negate(Box<Node>),
    Binary(BinaryOp, Box<Node>, Box<Node>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinaryOp {
    Or,
    And,
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    In,
}

impl BinaryOp {
    fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Or => "||",
            BinaryOp::And => "&&",
            BinaryOp::Equal => "==",
            BinaryOp::NotEqual => "!=",
            BinaryOp::Less => "<",
            BinaryOp::LessOrEqual => "<=",
            BinaryOp::Greater => ">",
            BinaryOp::GreaterOrEqual => ">=",
            BinaryOp::In => "in",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Integer(i64),
    Decimal(f64),
    Text(String),
    Symbol(&'static str),
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Name(name) => write!(f, "`{name}`"),
            Token::Integer(n) => write!(f, "`{n}`"),
            Token::Decimal(n) => write!(f, "`{n}`"),
            Token::Text(s) => write!(f, "{s:?}"),
            Token::Symbol(s) => write!(f, "`{s}`"),
            Token::End => f.write_str("the end"),
        }
    }
}

const SYMBOLS: [&str; 16] = [
    "==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "-", "(", ")", "[", "]", ".", ",",
];

/// The tokens of `source`, each with its column.
fn tokens(source: &str) -> Result<Vec<(Token, usize)>, ConditionError> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '-')
            {
                i += 1;
            }
            out.push((Token::Name(chars[start..i].iter().collect()), column));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let decimal = i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit();
            if decimal {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text: String = chars[start..i].iter().collect();
            let token = if decimal {
                text.parse().map(Token::Decimal).ok()
            } else {
                text.parse().map(Token::Integer).ok()
            };
            let token = token.ok_or_else(|| error(column, format!("`{text}` is out of range")))?;
            out.push((token, column));
        } else if c == '"' || c == '\'' {
            i += 1;
            let mut text = String::new();
            loop {
                let Some(&next) = chars.get(i) else {
                    return Err(error(column, "this string is not closed"));
                };
                i += 1;
                match next {
                    _ if next == c => break,
                    '\\' => {
                        let escaped = chars.get(i).copied();
                        i += 1;
                        text.push(match escaped {
                            Some('n') => '\n',
                            Some('t') => '\t',
                            Some(e @ ('\\' | '"' | '\'')) => e,
                            _ => {
                                return Err(error(
                                    i - 1,
                                    "unknown escape (use \\\\, \\\", \\', \\n or \\t)",
                                ));
                            }
                        });
                    }
                    other => text.push(other),
                }
            }
            out.push((Token::Text(text), column));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let Some(symbol) = SYMBOLS.iter().find(|s| rest.starts_with(**s)) else {
                return Err(error(column, format!("unexpected character `{c}`")));
            };
            i += symbol.chars().count();
            out.push((Token::Symbol(symbol), column));
        }
    }
    out.push((Token::End, chars.len() + 1));
    Ok(out)
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    next: usize,
    depth: usize,
    nodes: usize,
}

impl Parser {
    fn peek(&self) -> &(Token, usize) {
        &self.tokens[self.next.min(self.tokens.len() - 1)]
    }

    fn advance(&mut self) -> (Token, usize) {
        let token = self.peek().clone();
        self.next += 1;
        token
    }

    fn eat(&mut self, symbol: &str) -> bool {
        if matches!(&self.peek().0, Token::Symbol(s) if *s == symbol) {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, symbol: &str) -> Result<(), ConditionError> {
        if self.eat(symbol) {
            return Ok(());
        }
        let (token, column) = self.peek();
        Err(error(
            *column,
            format!("expected `{symbol}`, found {token}"),
        ))
    }

    fn node(&mut self, column: usize, kind: NodeKind) -> Result<Node, ConditionError> {
        self.nodes += 1;
        if self.nodes > MAX_CONDITION_NODES {
            return Err(error(
                column,
                format!("the expression has more than {MAX_CONDITION_NODES} parts"),
            ));
        }
        Ok(Node { column, kind })
    }

    /// Enters one level of nesting, refusing deeper than the limit (the
    /// parser and the evaluator recurse once per level).
    fn enter(&mut self, column: usize) -> Result<(), ConditionError> {
        self.depth += 1;
        if self.depth > MAX_CONDITION_DEPTH {
            return Err(error(
                column,
                format!("the expression nests deeper than {MAX_CONDITION_DEPTH} levels"),
            ));
        }
        Ok(())
    }

    fn expression(&mut self) -> Result<Node, ConditionError> {
        let column = self.peek().1;
        self.enter(column)?;
        let node = self.or();
        self.depth -= 1;
        node
    }

    fn or(&mut self) -> Result<Node, ConditionError> {
        let mut left = self.and()?;
        while let (Token::Symbol("||"), column) = self.peek().clone() {
            self.next += 1;
            let right = self.and()?;
            left = self.node(
                column,
                NodeKind::Binary(BinaryOp::Or, Box::new(left), Box::new(right)),
            )?;
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Node, ConditionError> {
        let mut left = self.compare()?;
        while let (Token::Symbol("&&"), column) = self.peek().clone() {
            self.next += 1;
            let right = self.compare()?;
            left = self.node(
                column,
                NodeKind::Binary(BinaryOp::And, Box::new(left), Box::new(right)),
            )?;
        }
        Ok(left)
    }

    fn compare(&mut self) -> Result<Node, ConditionError> {
        let left = self.unary()?;
        let (token, column) = self.peek().clone();
        let op = match token {
            Token::Symbol("==") => BinaryOp::Equal,
            Token::Symbol("!=") => BinaryOp::NotEqual,
            Token::Symbol("<") => BinaryOp::Less,
            Token::Symbol("<=") => BinaryOp::LessOrEqual,
            Token::Symbol(">") => BinaryOp::Greater,
            Token::Symbol(">=") => BinaryOp::GreaterOrEqual,
            Token::Name(name) if name == "in" => BinaryOp::In,
            _ => return Ok(left),
        };
        self.next += 1;
        let right = self.unary()?;
        if let (Token::Symbol(s), column) = self.peek()
            && ["==", "!=", "<", "<=", ">", ">="].contains(s)
        {
            return Err(error(
                *column,
                format!("`{s}` can not follow a comparison: use parentheses"),
            ));
        }
        self.node(
            column,
            NodeKind::Binary(op, Box::new(left), Box::new(right)),
        )
    }

    fn unary(&mut self) -> Result<Node, ConditionError> {
        let (token, column) = self.advance();
        match token {
            Token::Symbol("!") => {
                self.enter(column)?;
                let operand = self.unary();
                self.depth -= 1;
                let operand = operand?;
                self.node(column, NodeKind::Not(Box::new(operand)))
            }
            Token::Symbol("-") => {
                self.enter(column)?;
                let operand = self.unary();
                self.depth -= 1;
                let operand = operand?;
                self.node(column, NodeKind::Negate(Box::new(operand)))
            }
            Token::Symbol("(") => {
                let inner = self.expression()?;
                self.expect(")")?;
                Ok(inner)
            }
            Token::Symbol("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.expression()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                self.node(column, NodeKind::List(items))
            }
            Token::Integer(n) => self.node(column, NodeKind::Literal(Value::from(n))),
            Token::Decimal(n) => {
                let number = Number::from_f64(n)
                    .ok_or_else(|| error(column, format!("`{n}` is not a finite number")))?;
                self.node(column, NodeKind::Literal(Value::Number(number)))
            }
            Token::Text(s) => self.node(column, NodeKind::Literal(Value::String(s))),
            Token::Name(name) => match name.as_str() {
                "true" => self.node(column, NodeKind::Literal(Value::Bool(true))),
                "false" => self.node(column, NodeKind::Literal(Value::Bool(false))),
                "null" => self.node(column, NodeKind::Literal(Value::Null)),
                "in" => Err(error(column, "expected a value, found `in`")),
                _ => {
                    let reference = self.path(name, column)?;
                    self.node(column, NodeKind::Path(reference))
                }
            },
            other => Err(error(column, format!("expected a value, found {other}"))),
        }
    }

    /// The rest of a path that began with `head`, as a reference.
    fn path(&mut self, head: String, column: usize) -> Result<Reference, ConditionError> {
        let mut segments: Vec<(Segment, usize)> = Vec::new();
        loop {
            if self.eat(".") {
                match self.advance() {
                    (Token::Name(key), at) => segments.push((Segment::Key(key), at)),
                    (other, at) => {
                        return Err(error(
                            at,
                            format!("expected a name after `.`, found {other}"),
                        ));
                    }
                }
            } else if self.eat("[") {
                let segment = match self.advance() {
                    (Token::Integer(i), at) => usize::try_from(i)
                        .map(Segment::Index)
                        .map_err(|_| error(at, format!("`{i}` is not a list index")))?,
                    (Token::Text(key), _) => Segment::Key(key),
                    (other, at) => {
                        return Err(error(
                            at,
                            format!(
                                "expected a list index or a quoted key inside `[]`, found {other}"
                            ),
                        ));
                    }
                };
                let at = self.tokens[self.next - 1].1;
                self.expect("]")?;
                segments.push((segment, at));
            } else {
                break;
            }
        }
        let key_at = |i: usize| match segments.get(i) {
            Some((Segment::Key(key), _)) => Some(key.as_str()),
            _ => None,
        };
        let rest = |from: usize| -> Vec<Segment> {
            segments[from.min(segments.len())..]
                .iter()
                .map(|(s, _)| s.clone())
                .collect()
        };
        let (root, path) = match head.as_str() {
            "workflow" => match (key_at(0), key_at(1)) {
                (Some("input"), Some(key)) => (
                    Root::WorkflowInput,
                    std::iter::once(Segment::Key(key.to_owned()))
                        .chain(rest(2))
                        .collect(),
                ),
                (Some("check_mode"), _) if segments.len() == 1 => (Root::CheckMode, Vec::new()),
                _ => {
                    return Err(error(
                        column,
                        "`workflow` is read as workflow.input.<key> or workflow.check_mode",
                    ));
                }
            },
            "each" => match key_at(0) {
                Some(_) => (Root::Each, rest(0)),
                None => return Err(error(column, "`each` is read as each.<key>")),
            },
            "secrets" | "job" => {
                return Err(error(
                    column,
                    format!("`{head}` can not be read by a condition"),
                ));
            }
            step => match key_at(0) {
                Some("output") => (Root::StepOutput(step.to_owned()), rest(1)),
                _ => {
                    return Err(error(
                        column,
                        format!(
                            "unknown name `{step}` (expected workflow.input.<key>, workflow.check_mode, each.<key> or <step>.output)"
                        ),
                    ));
                }
            },
        };
        Ok(Reference { root, path })
    }
}

impl Condition {
    /// Parses `source`, refusing one over the limits of length, parts and
    /// nesting.
    pub fn parse(source: &str) -> Result<Condition, ConditionError> {
        if source.len() > MAX_CONDITION_BYTES {
            return Err(error(
                1,
                format!(
                    "the expression is {} bytes long, over the limit of {MAX_CONDITION_BYTES}",
                    source.len()
                ),
            ));
        }
        let mut parser = Parser {
            tokens: tokens(source)?,
            next: 0,
            depth: 0,
            nodes: 0,
        };
        if parser.peek().0 == Token::End {
            return Err(error(1, "the expression is empty"));
        }
        let root = parser.expression()?;
        match parser.peek() {
            (Token::End, _) => Ok(Condition { root }),
            (token, column) => Err(error(
                *column,
                format!("expected an operator or the end, found {token}"),
            )),
        }
    }

    /// Every reference it reads, with its column.
    pub fn references(&self) -> Vec<(usize, &Reference)> {
        let mut found = Vec::new();
        collect(&self.root, &mut found);
        found
    }

    /// Evaluates it against `scope`: true or false, or why it has no
    /// answer (a missing value, a type mismatch), with the column.
    pub fn evaluate(&self, scope: &Scope<'_>) -> Result<bool, ConditionError> {
        match evaluate(&self.root, scope)? {
            Value::Bool(b) => Ok(b),
            other => Err(error(
                self.root.column,
                format!("the expression gives {}, not a boolean", value_kind(&other)),
            )),
        }
    }
}

fn collect<'n>(node: &'n Node, found: &mut Vec<(usize, &'n Reference)>) {
    match &node.kind {
        NodeKind::Literal(_) => {}
        NodeKind::Path(reference) => found.push((node.column, reference)),
        NodeKind::List(items) => items.iter().for_each(|item| collect(item, found)),
        NodeKind::Not(inner) | NodeKind::Negate(inner) => collect(inner, found),
        NodeKind::Binary(_, left, right) => {
            collect(left, found);
            collect(right, found);
        }
    }
}

/// A path as the condition wrote it, for messages.
pub fn path_text(reference: &Reference) -> String {
    let text = reference.to_string();
    text.trim_start_matches("${")
        .trim_end_matches('}')
        .to_owned()
}

fn evaluate(node: &Node, scope: &Scope<'_>) -> Result<Value, ConditionError> {
    let at = node.column;
    match &node.kind {
        NodeKind::Literal(value) => Ok(value.clone()),
        NodeKind::Path(reference) => scope.lookup(reference).map_err(|message| {
            let message = message.replace(
                &reference.to_string(),
                &format!("`{}`", path_text(reference)),
            );
            error(at, message)
        }),
        NodeKind::List(items) => items
            .iter()
            .map(|item| evaluate(item, scope))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        NodeKind::Not(inner) => match evaluate(inner, scope)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            other => Err(error(
                at,
                format!("`!` needs a boolean, got {}", value_kind(&other)),
            )),
        },
        NodeKind::Negate(inner) => match evaluate(inner, scope)? {
            Value::Number(n) => {
                negate(&n).ok_or_else(|| error(at, format!("-{n} is out of range")))
            }
            other => Err(error(
                at,
                format!("`-` needs a number, got {}", value_kind(&other)),
            )),
        },
        NodeKind::Binary(op @ (BinaryOp::And | BinaryOp::Or), left, right) => {
            let operand = |node: &Node| match evaluate(node, scope)? {
                Value::Bool(b) => Ok(b),
                other => Err(error(
                    node.column,
                    format!(
                        "`{}` needs booleans, got {}",
                        op.symbol(),
                        value_kind(&other)
                    ),
                )),
            };
            // Short-circuit, left to right: `x != null && x.y` reads `x.y`
            // only when there is one.
            let left = operand(left)?;
            let decided = if *op == BinaryOp::And { !left } else { left };
            if decided {
                return Ok(Value::Bool(left));
            }
            operand(right).map(Value::Bool)
        }
        NodeKind::Binary(op, left, right) => {
            let (left, right) = (evaluate(left, scope)?, evaluate(right, scope)?);
            let answer = match op {
                BinaryOp::Equal => equal(&left, &right),
                BinaryOp::NotEqual => !equal(&left, &right),
                BinaryOp::In => match &right {
                    Value::Array(items) => items.iter().any(|item| equal(&left, item)),
                    Value::Object(map) => match &left {
                        Value::String(key) => map.contains_key(key),
                        other => {
                            return Err(error(
                                at,
                                format!(
                                    "`in` an object needs a string key, got {}",
                                    value_kind(other)
                                ),
                            ));
                        }
                    },
                    other => {
                        return Err(error(
                            at,
                            format!(
                                "`in` needs a list or an object on its right, got {}",
                                value_kind(other)
                            ),
                        ));
                    }
                },
                _ => {
                    let order = compare(&left, &right).ok_or_else(|| {
                        error(
                            at,
                            format!(
                                "`{}` compares two numbers or two strings, not {} with {}",
                                op.symbol(),
                                value_kind(&left),
                                value_kind(&right)
                            ),
                        )
                    })?;
                    match op {
                        BinaryOp::Less => order == Ordering::Less,
                        BinaryOp::LessOrEqual => order != Ordering::Greater,
                        BinaryOp::Greater => order == Ordering::Greater,
                        _ => order != Ordering::Less,
                    }
                }
            };
            Ok(Value::Bool(answer))
        }
    }
}

fn negate(n: &Number) -> Option<Value> {
    if let Some(i) = n.as_i64() {
        return i.checked_neg().map(Value::from);
    }
    n.as_f64()
        .and_then(|f| Number::from_f64(-f))
        .map(Value::Number)
}

/// Equality of JSON values, numbers by their value (`1 == 1.0`).
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => x.as_f64()?.partial_cmp(&y.as_f64()?),
        },
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
