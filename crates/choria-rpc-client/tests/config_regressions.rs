//! Regression tests for inputs the fuzzer found.

use choria_rpc_client::config::ChoriaConfig;
use choria_rpc_client::duration::parse_seconds_or_unit;

/// `discovery_timeout` made of many huge parts overflowed the sum of durations and panicked.
#[test]
fn duration_sum_overflow_is_invalid_not_a_panic() {
    // Each part fits in a Duration (1e19 s < u64::MAX s); their sum does not.
    let huge = "7377373ms".to_string() + &"10000000000000000000s".repeat(2);
    assert!(parse_seconds_or_unit(&huge).is_err());
    let text = format!("discovery_timeout = {huge}\n");
    // The file parses or is refused with an error; it never panics.
    let _ = ChoriaConfig::parse_str(&text);
}

/// The file that found it, as the fuzzer produced it.
#[test]
fn the_fuzzed_config_file_is_handled() {
    let data = include_bytes!("../testdata/regressions/duration-overflow.cfg");
    let _ = ChoriaConfig::parse_str(&String::from_utf8_lossy(data));
}
