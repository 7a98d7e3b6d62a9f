//! The standard `process_*` series, as the Prometheus Go client's process collector exports them
//! on Linux, read from `/proc/self` at every scrape.
//!
//! | series | from |
//! |---|---|
//! | `process_cpu_seconds_total` | `stat` utime + stime, in clock ticks |
//! | `process_open_fds` | the entries of `fd/` |
//! | `process_max_fds` | `limits`, "Max open files", soft limit |
//! | `process_virtual_memory_bytes` | `stat` vsize |
//! | `process_virtual_memory_max_bytes` | `limits`, "Max address space", soft limit |
//! | `process_resident_memory_bytes` | `stat` rss × the page size |
//! | `process_start_time_seconds` | `stat` starttime, after the boot time |
//! | `process_network_receive_bytes_total` | `net/netstat` IpExt InOctets |
//! | `process_network_transmit_bytes_total` | `net/netstat` IpExt OutOctets |
//!
//! As in the Go client, a series whose source cannot be read is left out (the others are still
//! exported) and an unlimited limit is 2⁶⁴−1. The clock tick and page size come from the
//! process's auxiliary vector (`auxv`), falling back to 100 Hz and 4096 bytes.
//!
//! The packaged unit mounts `/proc` with `subset=pid`, which hides `/proc/stat` and its boot
//! time. The boot time is then found from a thread started for the purpose: its `starttime`
//! (clock ticks since boot) is "now" on the boot clock, and the wall clock read just before
//! starting it gives the boot time to within a tick. It is computed once.
//!
//! Every file is read through a size cap, and at most [`MAX_FD_ENTRIES`] descriptors are
//! counted.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The most bytes read from one `/proc` file.
pub const MAX_PROC_FILE: u64 = 64 * 1024;

/// The most entries of `fd/` counted.
pub const MAX_FD_ENTRIES: u64 = 1 << 24;

const DEFAULT_CLOCK_TICKS: u64 = 100;
const DEFAULT_PAGE_SIZE: u64 = 4096;
const AT_PAGESZ: u64 = 6;
const AT_CLKTCK: u64 = 17;

/// Reads the process series from a `/proc/<pid>` directory (normally `/proc/self`).
#[derive(Debug)]
pub struct ProcessCollector {
    dir: PathBuf,
    proc_root: PathBuf,
    /// Wall-clock seconds when the collector was made: the start time of last resort.
    made_at: f64,
    constants: OnceLock<Constants>,
    boot_time: OnceLock<Option<f64>>,
}

#[derive(Debug, Clone, Copy)]
struct Constants {
    clock_ticks: u64,
    page_size: u64,
}

/// One reading of the process series; `None` where the source could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessSample {
    /// `process_cpu_seconds_total`
    pub cpu_seconds: Option<f64>,
    /// `process_open_fds`
    pub open_fds: Option<u64>,
    /// `process_max_fds`
    pub max_fds: Option<u64>,
    /// `process_virtual_memory_bytes`
    pub virtual_memory_bytes: Option<u64>,
    /// `process_virtual_memory_max_bytes`
    pub virtual_memory_max_bytes: Option<u64>,
    /// `process_resident_memory_bytes`
    pub resident_memory_bytes: Option<u64>,
    /// `process_start_time_seconds`
    pub start_time_seconds: Option<f64>,
    /// `process_network_receive_bytes_total`
    pub network_receive_bytes: Option<u64>,
    /// `process_network_transmit_bytes_total`
    pub network_transmit_bytes: Option<u64>,
}

/// The fields of `stat` the series use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: u64,
    rss: u64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessCollector {
    /// A collector of this process (`/proc/self`).
    pub fn new() -> Self {
        Self::at("/proc", "/proc/self")
    }

    /// A collector reading `dir` as the process directory and `proc_root` for `stat` (the boot
    /// time), for tests.
    pub fn at(proc_root: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Self {
        ProcessCollector {
            dir: dir.into(),
            proc_root: proc_root.into(),
            made_at: now_seconds(),
            constants: OnceLock::new(),
            boot_time: OnceLock::new(),
        }
    }

    fn constants(&self) -> Constants {
        *self.constants.get_or_init(|| {
            let auxv = read_capped(&self.dir.join("auxv")).ok();
            let find = |key| auxv.as_deref().and_then(|a| auxv_value(a, key));
            Constants {
                clock_ticks: find(AT_CLKTCK)
                    .filter(|&t| t > 0)
                    .unwrap_or(DEFAULT_CLOCK_TICKS),
                page_size: find(AT_PAGESZ)
                    .filter(|&p| p > 0)
                    .unwrap_or(DEFAULT_PAGE_SIZE),
            }
        })
    }

    /// The boot time in wall-clock seconds: `/proc/stat`'s `btime` when it can be read, else
    /// from a new thread's start time.
    fn boot_time(&self, clock_ticks: u64) -> Option<f64> {
        *self.boot_time.get_or_init(|| {
            if let Some(btime) = read_text(&self.proc_root.join("stat"))
                .ok()
                .and_then(|t| parse_btime(&t))
            {
                return Some(btime as f64);
            }
            boot_time_from_new_thread(&self.proc_root, clock_ticks)
        })
    }

    /// Read every series now.
    pub fn sample(&self) -> ProcessSample {
        let c = self.constants();
        let ticks = c.clock_ticks as f64;
        let stat = read_text(&self.dir.join("stat"))
            .ok()
            .and_then(|t| parse_stat(&t));
        let limits = read_text(&self.dir.join("limits")).ok();
        let limit = |name: &str| limits.as_deref().and_then(|l| parse_limit(l, name));
        let net = read_text(&self.dir.join("net/netstat"))
            .ok()
            .and_then(|t| parse_ip_octets(&t));
        let start_time_seconds = stat.map(|s| {
            let since_boot = s.starttime as f64 / ticks;
            match self.boot_time(c.clock_ticks) {
                Some(boot) => boot + since_boot,
                None => self.made_at,
            }
        });
        ProcessSample {
            cpu_seconds: stat.map(|s| s.utime.saturating_add(s.stime) as f64 / ticks),
            open_fds: count_entries(&self.dir.join("fd")),
            max_fds: limit("Max open files"),
            virtual_memory_bytes: stat.map(|s| s.vsize),
            virtual_memory_max_bytes: limit("Max address space"),
            resident_memory_bytes: stat.map(|s| s.rss.saturating_mul(c.page_size)),
            start_time_seconds,
            network_receive_bytes: net.map(|(rx, _)| rx),
            network_transmit_bytes: net.map(|(_, tx)| tx),
        }
    }
}

impl ProcessSample {
    /// Append the text exposition of the series that were read, in name order.
    pub fn encode(&self, out: &mut String) {
        let float = |v: Option<f64>| v.map(crate::fmt_f64);
        let int = |v: Option<u64>| v.map(|v| v.to_string());
        let series = [
            (
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                float(self.cpu_seconds),
            ),
            (
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                int(self.max_fds),
            ),
            (
                "process_network_receive_bytes_total",
                "counter",
                "Number of bytes received by the process over the network.",
                int(self.network_receive_bytes),
            ),
            (
                "process_network_transmit_bytes_total",
                "counter",
                "Number of bytes sent by the process over the network.",
                int(self.network_transmit_bytes),
            ),
            (
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                int(self.open_fds),
            ),
            (
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                int(self.resident_memory_bytes),
            ),
            (
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                float(self.start_time_seconds),
            ),
            (
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
                int(self.virtual_memory_bytes),
            ),
            (
                "process_virtual_memory_max_bytes",
                "gauge",
                "Maximum amount of virtual memory available in bytes.",
                int(self.virtual_memory_max_bytes),
            ),
        ];
        for (name, kind, help, value) in series {
            if let Some(value) = value {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                let _ = writeln!(out, "{name} {value}");
            }
        }
    }
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// At most [`MAX_PROC_FILE`] bytes of a file.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PROC_FILE)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

fn read_text(path: &Path) -> std::io::Result<String> {
    read_capped(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The entries of a directory, up to [`MAX_FD_ENTRIES`].
fn count_entries(dir: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut n = 0u64;
    for entry in entries {
        if entry.is_ok() {
            n += 1;
            if n >= MAX_FD_ENTRIES {
                break;
            }
        }
    }
    Some(n)
}

/// The `stat` fields after the command name, which may itself hold spaces and parentheses.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().take(22).collect();
    // fields[0] is field 3 (state) of proc(5).
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        starttime: field(22)?,
        vsize: field(23)?,
        rss: field(24)?,
    })
}

/// `btime` of `/proc/stat`.
fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of the `limits` row `name`; "unlimited" is 2⁶⁴−1 as in the Go client.
fn parse_limit(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(char::is_whitespace))
    })?;
    let soft = line[name.len()..].split_ascii_whitespace().next()?;
    if soft == "unlimited" {
        Some(u64::MAX)
    } else {
        soft.parse().ok()
    }
}

/// IpExt InOctets and OutOctets of `net/netstat` (a header line of names, then their values).
fn parse_ip_octets(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines().filter(|l| l.starts_with("IpExt:"));
    let names: Vec<&str> = lines.next()?.split_ascii_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_ascii_whitespace().collect();
    let value = |key: &str| {
        let i = names.iter().position(|n| *n == key)?;
        values.get(i)?.parse::<u64>().ok()
    };
    Some((value("InOctets")?, value("OutOctets")?))
}

/// The value of `key` in an auxiliary vector of native-endian machine words.
fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |b: &[u8]| -> Option<u64> {
        let mut a = [0u8; WORD];
        a.copy_from_slice(b.get(..WORD)?);
        u64::try_from(usize::from_ne_bytes(a)).ok()
    };
    auxv.chunks_exact(2 * WORD).find_map(|pair| {
        let k = word(pair)?;
        let v = word(pair.get(WORD..)?)?;
        (k == key).then_some(v)
    })
}

/// The boot time from a thread started now: its `starttime` is the boot clock's "now".
fn boot_time_from_new_thread(proc_root: &Path, clock_ticks: u64) -> Option<f64> {
    let wall = now_seconds();
    let own = proc_root.join("thread-self/stat");
    let starttime = std::thread::Builder::new()
        .name("boot-clock".into())
        .spawn(move || {
            read_text(&own)
                .ok()
                .and_then(|t| parse_stat(&t))
                .map(|s| s.starttime)
        })
        .ok()?
        .join()
        .ok()??;
    Some(wall - starttime as f64 / clock_ticks as f64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (choria (prov) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 125 0 0 20 0 9 0 987654 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(
            s,
            Stat {
                utime: 250,
                stime: 125,
                starttime: 987654,
                vsize: 123456789,
                rss: 2048
            }
        );
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn limits_give_the_soft_value_and_unlimited_is_the_largest_u64() {
        let limits =
            "Limit                     Soft Limit           Hard Limit           Units     \n\
Max open files            1024                 524288               files     \n\
Max address space         unlimited            unlimited            bytes     \n\
Max open filesX           7                    7                    files     \n";
        assert_eq!(parse_limit(limits, "Max open files"), Some(1024));
        assert_eq!(parse_limit(limits, "Max address space"), Some(u64::MAX));
        assert_eq!(parse_limit(limits, "Max locked memory"), None);
    }

    #[test]
    fn netstat_ip_octets_are_found_by_name() {
        let text = "TcpExt: SyncookiesSent\nTcpExt: 0\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 3 1000 2000\n";
        assert_eq!(parse_ip_octets(text), Some((1000, 2000)));
        assert_eq!(parse_ip_octets("IpExt: InOctets\nIpExt: 1\n"), None);
    }

    #[test]
    fn auxv_values_are_found() {
        let mut auxv = Vec::new();
        for (k, v) in [(AT_PAGESZ, 16384u64), (AT_CLKTCK, 250), (0, 0)] {
            auxv.extend_from_slice(&usize::try_from(k).unwrap().to_ne_bytes());
            auxv.extend_from_slice(&usize::try_from(v).unwrap().to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(16384));
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_value(&auxv, 99), None);
        assert_eq!(auxv_value(&auxv[..5], AT_PAGESZ), None);
    }

    /// A fake `/proc`: the series come from its files, and a missing file leaves its series out.
    #[test]
    fn a_fake_proc_directory_gives_every_series() {
        let root = std::env::temp_dir().join(format!("pm-proc-{}", std::process::id()));
        let dir = root.join("4242");
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::create_dir_all(dir.join("net")).unwrap();
        for i in 0..3 {
            std::fs::write(dir.join("fd").join(i.to_string()), "").unwrap();
        }
        std::fs::write(dir.join("stat"), STAT).unwrap();
        std::fs::write(
            dir.join("limits"),
            "Max open files            4096                 4096                 files\n\
Max address space         1000000              unlimited            bytes\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("net/netstat"),
            "IpExt: InOctets OutOctets\nIpExt: 11 22\n",
        )
        .unwrap();
        std::fs::write(root.join("stat"), "cpu 1 2 3\nbtime 1700000000\n").unwrap();
        let sample = ProcessCollector::at(&root, &dir).sample();
        let ticks = ProcessCollector::at(&root, &dir).constants();
        assert_eq!(ticks.clock_ticks, DEFAULT_CLOCK_TICKS);
        assert_eq!(
            sample,
            ProcessSample {
                cpu_seconds: Some(3.75),
                open_fds: Some(3),
                max_fds: Some(4096),
                virtual_memory_bytes: Some(123456789),
                virtual_memory_max_bytes: Some(1000000),
                resident_memory_bytes: Some(2048 * DEFAULT_PAGE_SIZE),
                start_time_seconds: Some(1700000000.0 + 9876.54),
                network_receive_bytes: Some(11),
                network_transmit_bytes: Some(22),
            }
        );
        std::fs::remove_file(dir.join("net/netstat")).unwrap();
        std::fs::remove_file(dir.join("limits")).unwrap();
        let mut text = String::new();
        ProcessCollector::at(&root, &dir).sample().encode(&mut text);
        assert!(text.contains("process_cpu_seconds_total 3.75\n"), "{text}");
        assert!(!text.contains("process_max_fds"), "{text}");
        assert!(
            !text.contains("process_network_receive_bytes_total"),
            "{text}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Without `/proc/stat` (`subset=pid`) the boot time found from a new thread agrees with
    /// `btime` to within a second.
    #[test]
    fn the_boot_time_without_proc_stat_matches_btime() {
        let btime = parse_btime(&read_text(Path::new("/proc/stat")).unwrap()).unwrap();
        let ticks = ProcessCollector::new().constants().clock_ticks;
        let found = boot_time_from_new_thread(Path::new("/proc"), ticks).unwrap();
        assert!(
            (found - btime as f64).abs() < 1.0,
            "btime {btime}, found {found}"
        );
    }

    /// The real process: every series is there and plausible.
    #[test]
    fn this_process_is_sampled() {
        let s = ProcessCollector::new().sample();
        let now = now_seconds();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        assert!(s.open_fds.unwrap() >= 3);
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap());
        assert!(s.resident_memory_bytes.unwrap() > 1024 * 1024);
        assert!(s.virtual_memory_bytes.unwrap() >= s.resident_memory_bytes.unwrap());
        assert!(s.cpu_seconds.unwrap() >= 0.0);
        assert!(s.virtual_memory_max_bytes.is_some());
        assert!(s.network_receive_bytes.is_some());
    }
}
