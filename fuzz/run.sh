#!/bin/sh
# Run every fuzz target for a bounded time each, one after the other, on one core.
# usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]   (needs nightly and cargo-fuzz)
set -eu
cd "$(dirname "$0")"
secs=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-"envelope_request envelope_reply rpc_reply lifecycle_event helper_reply provisioner_yaml choria_config jwt csr key_material identity csr_names pem claims_value"}
cargo +nightly fuzz build -O >/dev/null
bin=target/x86_64-unknown-linux-gnu/release
status=0
for t in $targets; do
    mkdir -p "target/corpus/$t" "artifacts/$t"
    start=$(date +%s)
    if "$bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
        "target/corpus/$t" "corpus/$t" >"target/$t.log" 2>&1; then
        result=ok
    else
        result="FAILED (see fuzz/target/$t.log and fuzz/artifacts/$t/)"
        status=1
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "target/$t.log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz: $t ran $(( $(date +%s) - start ))s, $runs executions: $result"
done
exit $status
