//! What the benchmark reads of a process and of the machine from `/proc`: CPU seconds (the
//! process's own and its waited-for children's), memory (resident now, at its peak), and the
//! machine's busy time.

/// USER_HZ on Linux: the unit of /proc's CPU times.
const TICKS: f64 = 100.0;

/// Fields of /proc/<pid>/stat after the command name (which is in parentheses and may contain
/// spaces): index 11 is utime, 12 stime, 13 cutime, 14 cstime.
fn stat_fields(pid: u32) -> Option<Vec<f64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect(),
    )
}

/// user+sys CPU seconds of a process from /proc/<pid>/stat.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((f.get(11)? + f.get(12)?) / TICKS)
}

/// user+sys CPU seconds of a process's children that it has waited for (its process helpers).
pub fn children_cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((f.get(13)? + f.get(14)?) / TICKS)
}

/// CPU seconds the whole machine has been busy (every state but idle and iowait), from the
/// first line of /proc/stat.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let total: f64 = f.iter().sum();
    Some((total - f.get(3)? - f.get(4)?) / TICKS)
}

/// Peak resident set size in MiB from /proc/<pid>/status.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmHWM:")
}

/// Resident set size now in MiB from /proc/<pid>/status.
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// A memory figure of /proc/<pid>/status (`VmHWM:`, `VmRSS:`) in MiB.
pub fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Resident set size in bytes from /proc/<pid>/statm.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
