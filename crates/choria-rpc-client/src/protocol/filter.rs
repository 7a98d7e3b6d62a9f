//! The request filter (identity, agent, class, fact, compound) and its server-side matching.
//!
//! Matching follows go-choria: an empty filter matches every node; otherwise every non-empty
//! group must match. Identity entries are OR-ed, agent, class and fact entries AND-ed. Entries
//! wrapped in slashes are regular expressions (classes case-insensitively). Compound
//! expressions are not evaluated: a filter with any compound entry never matches.

use serde::{Deserialize, Serialize};

use super::ProtocolError;

/// One fact comparison, e.g. `os.family == RedHat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactFilter {
    /// Fact name, a dotted path into the node's facts.
    pub fact: String,
    /// One of `>=`, `<=`, `<`, `>`, `!=`, `==`, `=~`.
    pub operator: String,
    /// Value to compare with.
    pub value: String,
}

/// A Choria request filter. All five arrays are always serialised, as go-choria does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Filter {
    /// Fact comparisons, all of which must hold.
    #[serde(default)]
    pub fact: Vec<FactFilter>,
    /// Classes, all of which the node must have.
    #[serde(default, rename = "cf_class")]
    pub class: Vec<String>,
    /// Agents, all of which must be active on the node.
    #[serde(default)]
    pub agent: Vec<String>,
    /// Identities, one of which must match.
    #[serde(default)]
    pub identity: Vec<String>,
    /// Compound expressions, kept as received (never evaluated).
    #[serde(default)]
    pub compound: Vec<serde_json::Value>,
}

/// What a server knows about itself for filter matching.
#[derive(Debug, Clone, Copy)]
pub struct NodeInfo<'a> {
    /// The node's identity.
    pub identity: &'a str,
    /// Active agents.
    pub agents: &'a [String],
    /// Classes.
    pub classes: &'a [String],
    /// Facts JSON (an object, or `Null` when there are none).
    pub facts: &'a serde_json::Value,
}

/// Filter as received, with presence of each key kept for the schema check.
#[derive(Deserialize)]
pub(crate) struct FilterIn {
    fact: Option<Vec<FactFilter>>,
    cf_class: Option<Vec<String>>,
    agent: Option<Vec<String>>,
    identity: Option<Vec<String>>,
    compound: Option<Vec<serde_json::Value>>,
}

impl FilterIn {
    /// The go-choria schema: `fact`, `cf_class`, `identity`, `compound` are required arrays,
    /// `agent` is optional.
    pub(crate) fn into_filter(self, layer: &'static str) -> Result<Filter, ProtocolError> {
        let need = |name: &str| ProtocolError::Schema {
            layer,
            reason: format!("filter.{name} is required"),
        };
        Ok(Filter {
            fact: self.fact.ok_or_else(|| need("fact"))?,
            class: self.cf_class.ok_or_else(|| need("cf_class"))?,
            agent: self.agent.unwrap_or_default(),
            identity: self.identity.ok_or_else(|| need("identity"))?,
            compound: self.compound.ok_or_else(|| need("compound"))?,
        })
    }
}

impl Filter {
    /// A filter selecting nodes on which `agent` is active.
    pub fn with_agent(agent: impl Into<String>) -> Self {
        Filter {
            agent: vec![agent.into()],
            ..Filter::default()
        }
    }

    /// A filter selecting one identity.
    pub fn with_identity(identity: impl Into<String>) -> Self {
        Filter {
            identity: vec![identity.into()],
            ..Filter::default()
        }
    }

    /// True when no group has entries.
    pub fn is_empty(&self) -> bool {
        self.fact.is_empty()
            && self.class.is_empty()
            && self.agent.is_empty()
            && self.identity.is_empty()
            && self.compound.is_empty()
    }

    /// Whether a node with `node`'s properties should act on a request with this filter.
    pub fn matches(&self, node: &NodeInfo<'_>) -> bool {
        self.matcher().matches(node)
    }

    /// This filter with its identity expressions compiled once, for matching many nodes (a
    /// broadcast reaches every node of a simulated fleet; a sharded discovery's identity
    /// expression would otherwise be compiled once a node).
    pub fn matcher(&self) -> Matcher<'_> {
        Matcher {
            filter: self,
            identity: self
                .identity
                .iter()
                .map(|f| match regex_body(f) {
                    Some(re) => IdentityPattern::Regex(regex::Regex::new(re).ok()),
                    None => IdentityPattern::Exact(f),
                })
                .collect(),
        }
    }

    /// The discovery shard `shard` of `shards` (counted from 0): an identity expression that
    /// matches a node by the character before the first dot of its identity (the last of its
    /// host name), so the shards of one count split every identity between them, each to
    /// exactly one. Characters are dealt out in turn (`0`, `1`, ... `9`, `a`, ... `z`, either
    /// case), so host names ending in digits spread over up to ten shards; the last shard
    /// also takes every other character. `None` when `shards` is below 2 or `shard` is out of
    /// range.
    pub fn identity_shard(shard: usize, shards: usize) -> Option<String> {
        Self::identity_shards(shard..shard.saturating_add(1), shards)
    }

    /// The discovery shards `range` of `shards` together (see [`Filter::identity_shard`]): one
    /// expression for the nodes of all of them, for example every shard but the first after
    /// the first has been asked alone. `None` when `shards` is below 2 or the range is empty
    /// or out of range.
    pub fn identity_shards(range: std::ops::Range<usize>, shards: usize) -> Option<String> {
        if shards < 2 || range.is_empty() || range.end > shards {
            return None;
        }
        let mut class = String::new();
        for (i, c) in SHARD_CHARS.chars().enumerate() {
            if range.contains(&(i % shards)) {
                class.push(c);
                if c.is_ascii_lowercase() {
                    class.push(c.to_ascii_uppercase());
                }
            }
        }
        let last = range.end == shards;
        let tail = match (class.is_empty(), last) {
            (true, true) => "[^.0-9A-Za-z]".to_string(),
            (true, false) => return None,
            (false, true) => format!("([{class}]|[^.0-9A-Za-z])"),
            (false, false) => format!("[{class}]"),
        };
        Some(format!("/^[^.]*{tail}(\\.|$)/"))
    }
}

/// The characters [`Filter::identity_shard`] deals out to shards, in turn.
const SHARD_CHARS: &str = "0123456789abcdefghijklmnopqrstuvwxyz";

/// One identity entry of a filter, compiled.
enum IdentityPattern<'a> {
    Exact(&'a str),
    /// `None`: not a valid expression, matches nothing (as go-choria).
    Regex(Option<regex::Regex>),
}

/// A [`Filter`] ready to match many nodes ([`Filter::matcher`]).
pub struct Matcher<'a> {
    filter: &'a Filter,
    identity: Vec<IdentityPattern<'a>>,
}

impl Matcher<'_> {
    /// Whether a node with `node`'s properties should act on a request with this filter.
    pub fn matches(&self, node: &NodeInfo<'_>) -> bool {
        let filter = self.filter;
        if !filter.compound.is_empty() {
            return false;
        }
        if !self.identity.is_empty()
            && !self.identity.iter().any(|p| match p {
                IdentityPattern::Exact(f) => *f == node.identity,
                IdentityPattern::Regex(re) => {
                    re.as_ref().is_some_and(|r| r.is_match(node.identity))
                }
            })
        {
            return false;
        }
        if !filter
            .agent
            .iter()
            .all(|f| node.agents.iter().any(|a| match_string(f, a, false)))
        {
            return false;
        }
        if !filter
            .class
            .iter()
            .all(|f| node.classes.iter().any(|c| match_string(f, c, true)))
        {
            return false;
        }
        filter.fact.iter().all(|f| match_fact(f, node.facts))
    }
}

/// `/re/` entries are regular expressions, anything else an exact match.
fn match_string(filter: &str, value: &str, case_insensitive: bool) -> bool {
    if let Some(re) = regex_body(filter) {
        return regex::RegexBuilder::new(re)
            .case_insensitive(case_insensitive)
            .build()
            .map(|r| r.is_match(value))
            .unwrap_or(false);
    }
    if case_insensitive {
        filter.eq_ignore_ascii_case(value)
    } else {
        filter == value
    }
}

fn regex_body(filter: &str) -> Option<&str> {
    if filter.len() >= 2 {
        filter.strip_prefix('/')?.strip_suffix('/')
    } else {
        None
    }
}

fn lookup<'a>(facts: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    let mut cur = facts;
    for part in path.split('.') {
        cur = match cur {
            serde_json::Value::Object(m) => m.get(part)?,
            serde_json::Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn match_fact(f: &FactFilter, facts: &serde_json::Value) -> bool {
    let Some(v) = lookup(facts, &f.fact) else {
        return false;
    };
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => return false,
        other => other.to_string(),
    };
    let numbers = || Some((text.parse::<f64>().ok()?, f.value.parse::<f64>().ok()?));
    match f.operator.as_str() {
        "==" => match numbers() {
            Some((a, b)) => a == b,
            None => text.eq_ignore_ascii_case(&f.value),
        },
        "!=" => match numbers() {
            Some((a, b)) => a != b,
            None => !text.eq_ignore_ascii_case(&f.value),
        },
        "=~" => {
            let re = regex_body(&f.value).unwrap_or(&f.value);
            regex::RegexBuilder::new(re)
                .case_insensitive(true)
                .build()
                .map(|r| r.is_match(&text))
                .unwrap_or(false)
        }
        op @ ("<" | ">" | "<=" | ">=") => {
            let ord = match numbers() {
                Some((a, b)) => a.partial_cmp(&b),
                None => Some(text.as_str().cmp(f.value.as_str())),
            };
            let Some(ord) = ord else { return false };
            match op {
                "<" => ord.is_lt(),
                ">" => ord.is_gt(),
                "<=" => ord.is_le(),
                _ => ord.is_ge(),
            }
        }
        _ => false,
    }
}
