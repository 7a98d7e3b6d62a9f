//! The fleet simulator (`choria-fleet-sim`) as a process: started with its arguments and a
//! report written at exit, watched through its progress lines, stopped with SIGTERM, its report
//! read into [`NodeReport`]s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{logs, Error, IoContext, ProcessGuard, Result};

/// The simulator's report: one record per node, by identity.
pub type Report = BTreeMap<String, NodeReport>;

/// One node's record from the simulator's report.
#[derive(Debug)]
pub struct NodeReport {
    /// Whether the node ended provisioned.
    pub provisioned: bool,
    /// `(action, statuscode)` in arrival order; 255 means the node stayed silent.
    pub actions: Vec<(String, u64)>,
    /// What the node received from the provisioner, when anything.
    pub received: Option<Value>,
    /// What the node found wrong.
    pub problems: Vec<String>,
}

impl NodeReport {
    /// Whether the node was sent `action`.
    pub fn saw(&self, action: &str) -> bool {
        self.actions.iter().any(|(a, _)| a == action)
    }

    /// How many `action` requests the node answered with success.
    pub fn ok_count(&self, action: &str) -> usize {
        self.actions
            .iter()
            .filter(|(a, c)| a == action && *c == 0)
            .count()
    }
}

/// A running simulator, stopped when dropped, with its progress on standard error in `log`.
pub struct Simulator {
    /// The process.
    pub proc: ProcessGuard,
    /// Where it writes its report at exit.
    pub report: PathBuf,
    /// Its standard error: start-up and progress lines.
    pub log: PathBuf,
}

impl Simulator {
    /// `choria-fleet-sim` from `bins`, without arguments.
    pub fn command(bins: &Path) -> Command {
        Command::new(bins.join("choria-fleet-sim"))
    }

    /// Start `cmd` (program and arguments set) with `--report report` added, standard output
    /// discarded and standard error in `log` (emptied first).
    pub fn start(cmd: &mut Command, report: &Path, log: &Path) -> Result<Self> {
        let err = std::fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        cmd.arg("--report")
            .arg(report)
            .stdout(Stdio::null())
            .stderr(err);
        let proc = ProcessGuard::spawn("choria-fleet-sim", cmd)?;
        Ok(Simulator {
            proc,
            report: report.to_path_buf(),
            log: log.to_path_buf(),
        })
    }

    /// How many nodes the simulator counts as provisioned, from its latest progress line
    /// (`fleet-sim: 35s 40/40 provisioned, ...`, one a second).
    pub fn provisioned(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .rev()
            .find_map(progress_provisioned)
            .unwrap_or(0)
    }

    /// Stop it with SIGTERM, sent again every second for up to 20 s (one sent while the
    /// simulator is between two waits can be missed), then SIGTERM and SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let start = Instant::now();
        while self.proc.running() && start.elapsed() < Duration::from_secs(20) {
            self.proc.signal("TERM");
            let tick = Instant::now();
            while self.proc.running() && tick.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.proc.terminate(Duration::from_secs(5));
    }

    /// Stop it and read its report.
    pub fn finish(mut self) -> Result<Report> {
        self.stop();
        let text = std::fs::read(&self.report).map_err(|err| {
            Error::Failed(format!(
                "no simulator report {}: {}: {err}",
                self.report.display(),
                logs::tail(&self.log, 5)
            ))
        })?;
        parse_report(&text)
    }
}

/// Parse a simulator report (a JSON array of node records).
pub fn parse_report(text: &[u8]) -> Result<Report> {
    let v: Vec<Value> = serde_json::from_slice(text)
        .map_err(|e| Error::Failed(format!("simulator report: {e}")))?;
    let mut out = BTreeMap::new();
    for n in v {
        let id = n["identity"].as_str().unwrap_or_default().to_string();
        let actions = n["actions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        (
                            x["action"].as_str().unwrap_or_default().to_string(),
                            x["statuscode"].as_u64().unwrap_or(255),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.insert(
            id,
            NodeReport {
                provisioned: n["provisioned"].as_bool().unwrap_or(false),
                actions,
                received: n.get("received").filter(|r| !r.is_null()).cloned(),
                problems: n["problems"]
                    .as_array()
                    .map(|p| {
                        p.iter()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
        );
    }
    Ok(out)
}

/// The provisioned count of one simulator progress line, `None` for any other line.
pub fn progress_provisioned(line: &str) -> Option<usize> {
    let mut words = line.strip_prefix("fleet-sim: ")?.split_whitespace();
    words.next()?.strip_suffix('s')?;
    let (done, _) = words.next()?.split_once('/')?;
    (words.next()? == "provisioned,").then_some(())?;
    done.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provisioned_count_is_read_from_progress_lines_only() {
        let line = "fleet-sim: 35s 32/40 provisioned, 33 configured, 0 broken, 0 shut down, 141 requests, 133 replies (0 discovery), 0 ignored, 137 events";
        assert_eq!(progress_provisioned(line), Some(32));
        assert_eq!(
            progress_provisioned("fleet-sim: 40 nodes up on nats://127.0.0.1:41927 (Plain, V1)"),
            None
        );
        assert_eq!(
            progress_provisioned("fleet-sim: 40/40 nodes provisioned"),
            None
        );
        assert_eq!(
            progress_provisioned("fleet-sim: 5s x/40 provisioned, 0 configured"),
            None
        );
        assert_eq!(progress_provisioned("something else"), None);
    }

    #[test]
    fn a_report_is_read_into_node_records() {
        let text = br#"[
            {"identity": "n-1.example.net", "provisioned": true,
             "actions": [{"action": "gencsr", "statuscode": 0}, {"action": "configure", "statuscode": 0},
                         {"action": "configure"}],
             "received": {"jwt": "x"}, "problems": ["late"]},
            {"identity": "n-2.example.net", "received": null}
        ]"#;
        let r = parse_report(text).expect("a valid report");
        let n1 = &r["n-1.example.net"];
        assert!(n1.provisioned);
        assert!(n1.saw("gencsr") && !n1.saw("restart"));
        assert_eq!(n1.ok_count("configure"), 1);
        assert_eq!(n1.actions[2], ("configure".to_string(), 255));
        assert!(n1.received.is_some());
        assert_eq!(n1.problems, vec!["late".to_string()]);
        let n2 = &r["n-2.example.net"];
        assert!(!n2.provisioned && n2.actions.is_empty() && n2.received.is_none());
        assert!(parse_report(b"{}").is_err());
    }
}
