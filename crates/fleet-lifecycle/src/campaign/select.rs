//! Which nodes a campaign takes: a file of identities, a discovery filter on the main
//! collective, or what the audit stream recorded as expiring ([`Operator::select`]); and the
//! operator's handle that starts and drives a campaign.

use super::*;

/// Reads `path`: one identity a line, `#` comments and blank lines skipped, each checked against
/// `rule`, repeats dropped.
pub fn read_identities(path: &Path, rule: &IdentityRule) -> Result<Vec<String>, CampaignError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| CampaignError::Select(format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_IDENTITIES_FILE {
        return Err(CampaignError::Select(format!(
            "{} is {} bytes, more than the {MAX_IDENTITIES_FILE} read",
            path.display(),
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CampaignError::Select(format!("{}: {e}", path.display())))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rule.check(line).map_err(|e| {
            CampaignError::Select(format!(
                "{} line {}: {}: {e}",
                path.display(),
                n + 1,
                escaped(line)
            ))
        })?;
        if seen.insert(line.to_string()) {
            out.push(line.to_string());
        }
    }
    Ok(out)
}

/// Parses `--filter`: terms separated by spaces, each `identity=VALUE` (a name or `/REGEX/`),
/// `class=NAME`, `agent=NAME`, or a fact comparison `FACT OP VALUE` with OP one of `==`, `=`,
/// `!=`, `<=`, `>=`, `<`, `>`, `=~`. Only servers with the `choria_provision` agent can be
/// reprovisioned, so that agent is always required.
pub fn parse_filter(expr: &str) -> Result<Filter, CampaignError> {
    let mut f = Filter::with_agent("choria_provision");
    for term in expr.split_whitespace() {
        let invalid =
            |why: &str| CampaignError::Invalid(format!("--filter term {}: {why}", escaped(term)));
        let op = ["==", "!=", "<=", ">=", "=~", "=", "<", ">"]
            .into_iter()
            .filter_map(|op| term.find(op).map(|at| (at, op)))
            .min_by_key(|(at, op)| (*at, usize::MAX - op.len()))
            .ok_or_else(|| invalid("it is not NAME=VALUE or FACT OP VALUE"))?;
        let (name, value) = (&term[..op.0], &term[op.0 + op.1.len()..]);
        if name.is_empty() || value.is_empty() {
            return Err(invalid("both sides must be given"));
        }
        match (name, op.1) {
            ("identity", "=" | "==") => f.identity.push(value.to_string()),
            ("class", "=" | "==") => f.class.push(value.to_string()),
            ("agent", "=" | "==") => f.agent.push(value.to_string()),
            (fact, op) => f.fact.push(FactFilter {
                fact: fact.to_string(),
                operator: if op == "=" { "==".into() } else { op.into() },
                value: value.to_string(),
            }),
        }
    }
    Ok(f)
}

/// Broadcast discovery of the servers matching `filter` on the main collective.
pub async fn discover(rpc: &RpcClient, filter: &Filter) -> Result<Vec<String>, CampaignError> {
    rpc.discover(
        filter,
        Duration::from_secs(10),
        Some(Duration::from_secs(2)),
    )
    .await
    .map_err(|e| CampaignError::Select(e.to_string()))
}

/// The nodes whose last `provisioned` record in the audit stream says what they were issued
/// expires before `now + within`.
pub async fn expiring(
    js: &jetstream::Context,
    stream: &str,
    within: Duration,
) -> Result<Vec<String>, CampaignError> {
    let mut last: HashMap<String, Option<i64>> = HashMap::new();
    read_audit(js, stream, 1, |a| {
        if a.decision == "provisioned" {
            last.insert(a.identity, a.expires);
        }
    })
    .await?;
    let limit = now_unix().saturating_add(i64::try_from(within.as_secs()).unwrap_or(i64::MAX));
    let mut out: Vec<String> = last
        .into_iter()
        .filter_map(|(id, exp)| exp.filter(|e| *e <= limit).map(|_| id))
        .collect();
    out.sort();
    Ok(out)
}

/// An operator's handle on campaigns: the bucket, and what of the provisioner's settings a
/// campaign reads (the provisioner crate's `operator::campaigns` makes one from its files).
#[derive(Debug)]
pub struct Operator {
    /// The campaign bucket.
    pub campaigns: Campaigns,
    /// The provisioners' identity rule: a selected name it refuses is left out.
    pub rule: IdentityRule,
    /// The audit stream (`audit_stream`), empty for none.
    pub audit_stream: String,
    /// The provisioning token the reprovision requests carry.
    pub token: String,
}

/// How a campaign's nodes are chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// A file of identities.
    Identities(std::path::PathBuf),
    /// Broadcast discovery on the main collective with this filter.
    Filter(String),
    /// The nodes whose certificate or server JWT, as the audit stream recorded it, expires
    /// within this long.
    ExpiringWithin(Duration),
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Identities(p) => write!(f, "--identities {}", p.display()),
            Selection::Filter(e) => write!(f, "--filter {e}"),
            Selection::ExpiringWithin(d) => write!(f, "--expiring-within {}s", d.as_secs()),
        }
    }
}

impl Operator {
    /// The nodes `selection` names. Discovery uses `rpc`, the main collective's client.
    pub async fn select(
        &self,
        selection: &Selection,
        rpc: &RpcClient,
    ) -> Result<Vec<String>, CampaignError> {
        let rule = &self.rule;
        let mut nodes = match selection {
            Selection::Identities(path) => read_identities(path, rule)?,
            Selection::Filter(expr) => discover(rpc, &parse_filter(expr)?).await?,
            Selection::ExpiringWithin(within) => {
                let stream = self.audit_stream().ok_or_else(|| {
                    CampaignError::Invalid(
                        "--expiring-within reads what was issued from the audit stream; set audit_stream in the provisioner configuration".into(),
                    )
                })?;
                expiring(&self.audit_context(stream).await?, stream, *within).await?
            }
        };
        nodes.retain(|n| rule.check(n).is_ok());
        Ok(nodes)
    }

    /// The audit stream's name, when one is configured.
    pub fn audit_stream(&self) -> Option<&str> {
        let s = self.audit_stream.as_str();
        (!s.is_empty()).then_some(s)
    }

    /// Starts a campaign over `nodes`.
    pub async fn start(
        &self,
        selection: &Selection,
        nodes: Vec<String>,
        limits: Limits,
        on_stored: impl FnMut(usize),
    ) -> Result<CampaignRecord, CampaignError> {
        let audit_from = match self.audit_stream() {
            Some(s) => Some(audit_next_sequence(&self.audit_context(s).await?, s).await?),
            None => None,
        };
        self.campaigns
            .start(&selection.to_string(), nodes, limits, audit_from, on_stored)
            .await
    }

    /// The JetStream API audit stream `stream` answers on, over the provisioners' connection.
    pub async fn audit_context(&self, stream: &str) -> Result<jetstream::Context, CampaignError> {
        let client = self
            .campaigns
            .provisioning
            .clone()
            .ok_or_else(|| CampaignError::Audit {
                stream: stream.to_string(),
                detail: "no connection with the provisioner's settings".into(),
            })?;
        let mut errors = Vec::new();
        for api in StreamsApi::ALL {
            let js = api.context(client.clone(), REQUEST_TIMEOUT);
            match js.get_stream(stream).await {
                Ok(_) => return Ok(js),
                Err(e) => errors.push(format!("{api}: {e}")),
            }
        }
        Err(CampaignError::Audit {
            stream: stream.to_string(),
            detail: errors.join("; "),
        })
    }

    /// A driver of the campaign over `rpc`, the main collective's client.
    pub async fn driver(&self, rpc: RpcClient) -> Result<Driver, CampaignError> {
        let audit = match self.audit_stream() {
            Some(s) => Some((self.audit_context(s).await?, s.to_string())),
            None => None,
        };
        Ok(Driver {
            campaigns: self.campaigns.clone(),
            rpc,
            token: self.token.clone(),
            audit,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_into_fact_identity_class_and_agent_terms() {
        let f = parse_filter("os.family=RedHat identity=/^web/ class=apache mem>=4 agent=puppet")
            .unwrap();
        assert_eq!(f.agent, vec!["choria_provision", "puppet"]);
        assert_eq!(f.identity, vec!["/^web/"]);
        assert_eq!(f.class, vec!["apache"]);
        assert_eq!(f.fact.len(), 2);
        assert_eq!(
            (
                f.fact[0].fact.as_str(),
                f.fact[0].operator.as_str(),
                f.fact[0].value.as_str()
            ),
            ("os.family", "==", "RedHat")
        );
        assert_eq!(f.fact[1].operator, ">=");
        let re = parse_filter("country=~/^m/").unwrap();
        assert_eq!(re.fact[0].operator, "=~");
        assert!(parse_filter("justaword").is_err());
        assert!(parse_filter("=x").is_err());
        assert_eq!(parse_filter("").unwrap().agent, vec!["choria_provision"]);
    }

    #[test]
    fn identities_files_skip_comments_and_repeats_and_refuse_bad_names() {
        let dir = std::env::temp_dir().join(format!("rotate-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(
            &good,
            "# web tier\nweb1.example.net\n\n web2.example.net \nweb1.example.net\n",
        )
        .unwrap();
        let rule = IdentityRule::builtin();
        assert_eq!(
            read_identities(&good, &rule).unwrap(),
            vec!["web1.example.net", "web2.example.net"]
        );
        let bad = dir.join("bad");
        std::fs::write(&bad, "web1.example.net\nweb*.example.net\n").unwrap();
        let e = read_identities(&bad, &rule).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
