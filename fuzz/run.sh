#!/bin/sh
# Runs every fuzz target, of fuzz/ and of crates/rpm-evr/fuzz, for a bounded time each, and
# prints one line per target. The exit status is 1 when any target crashed, timed out or ran
# out of memory; the input that did it is kept under that crate's artifacts/TARGET/ and the
# run's output in its target/TARGET.log.
#
# usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]   (needs nightly and cargo-fuzz)
#
# FUZZ_JOBS is how many targets run at once, one core each (default: the number of cores), so
# the whole run takes about SECONDS_PER_TARGET x targets / FUZZ_JOBS after the build.
# FUZZ_SANITIZER is passed to cargo fuzz build -s (default address), and FUZZ_CODEGEN_UNITS to
# --codegen-units (default cargo-fuzz's 1: the slowest build and the fastest targets), and
# FUZZ_PROFILE chooses the build (below). FUZZ_BUILD_ONLY=1 builds and runs nothing.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
[ $# -gt 0 ] && shift
wanted=${*:-}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
sanitizer=${FUZZ_SANITIZER:-address}
cgu=${FUZZ_CODEGEN_UNITS:+--codegen-units $FUZZ_CODEGEN_UNITS}
# FUZZ_PROFILE=dev builds without optimisation or debug information: about a third of the
# release build's time on two cores, for targets that run about a tenth of the inputs a second
# (a short smoke pass); the default, release, is for real fuzzing.
case ${FUZZ_PROFILE:-release} in
    release) opt=-O; outdir=release ;;
    dev) opt=--dev; outdir=debug; CARGO_PROFILE_DEV_DEBUG=0; export CARGO_PROFILE_DEV_DEBUG ;;
    *) echo "fuzz: FUZZ_PROFILE is release or dev, not ${FUZZ_PROFILE}" >&2; exit 2 ;;
esac
crates="fuzz crates/rpm-evr/fuzz"

# "CRATE TARGET" for every target, or for the ones named.
targets() {
    for crate in $crates; do
        for f in "$root/$crate"/fuzz_targets/*.rs; do
            t=$(basename "$f" .rs)
            if [ -z "$wanted" ] || printf ' %s ' "$wanted" | grep -q " $t "; then
                echo "$crate $t"
            fi
        done
    done
}

list=$(targets)
if [ -z "$list" ]; then
    echo "fuzz: no target named $wanted" >&2
    exit 2
fi

# Every crate with a wanted target is built once, all its targets together (they share the
# build of their dependencies). cargo fuzz is run from the directory holding the fuzz crate.
# shellcheck disable=SC2086 # $cgu is empty or two words
for crate in $crates; do
    echo "$list" | grep -q "^$crate " || continue
    log="$root/$crate/target/build.log"
    mkdir -p "$root/$crate/target"
    if ! (cd "$root/$crate/.." && cargo +nightly fuzz build $opt -s "$sanitizer" $cgu --fuzz-dir "$root/$crate" >"$log" 2>&1); then
        echo "fuzz: building $crate FAILED (see $crate/target/build.log)"
        tail -n 20 "$log" >&2
        exit 1
    fi
done

# FUZZ_BUILD_ONLY=1: the build alone (CI builds while other stages run).
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then
    echo "fuzz: built"
    exit 0
fi

failed=$(mktemp)
trap 'rm -f "$failed"' EXIT

# One target: its new inputs go to target/corpus/TARGET (not kept in git), its seeds are read
# from corpus/TARGET or seeds/, with the crate's dictionary when it has one.
run_one() {
    crate=$1
    t=$2
    dir="$root/$crate"
    bin=$(find "$dir/target" -path "*/$outdir/$t" -type f 2>/dev/null | head -n 1)
    mkdir -p "$dir/target/corpus/$t" "$dir/artifacts/$t"
    seeds=""
    for s in "$dir/corpus/$t" "$dir/seeds"; do
        [ -d "$s" ] && seeds="$seeds $s"
    done
    dict=""
    for d in "$dir"/*.dict; do
        [ -f "$d" ] && dict="-dict=$d"
    done
    start=$(date +%s)
    # shellcheck disable=SC2086 # the seed directories and the dictionary are separate words
    if [ -n "$bin" ] && "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -artifact_prefix="$dir/artifacts/$t/" -print_final_stats=1 $dict \
        "$dir/target/corpus/$t" $seeds >"$dir/target/$t.log" 2>&1; then
        result=ok
    else
        result="FAILED (see $crate/target/$t.log and $crate/artifacts/$t/)"
        echo "$t" >>"$failed"
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/target/$t.log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz: $t ran $(($(date +%s) - start))s, $runs executions: $result"
}

# The targets dealt round-robin to FUZZ_JOBS lanes; each lane runs its targets one after the
# other, the lanes side by side.
lane=0
while [ "$lane" -lt "$jobs" ]; do
    echo "$list" | awk -v n="$jobs" -v l="$lane" '(NR - 1) % n == l' | {
        while read -r crate t; do
            run_one "$crate" "$t"
        done
    } &
    lane=$((lane + 1))
done
wait

if [ -s "$failed" ]; then
    echo "fuzz: $(wc -l <"$failed") of $(echo "$list" | wc -l) targets FAILED: $(tr '\n' ' ' <"$failed")"
    exit 1
fi
