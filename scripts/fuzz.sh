#!/usr/bin/env bash
# Run the cargo-fuzz targets one after another and summarise them.
#
#   scripts/fuzz.sh [--time T | --runs N] [--sanitizer S] [TARGET...]
#
# Every target (or only those named) is built and run for T seconds
# (default 60) or N executions, after replaying the inputs that once
# failed it (fuzz/regressions/<t>, committed: each must pass), under
# sanitizer S (cargo fuzz's -s:
# address, the default, or none, about three times faster on the
# host_session target, for runs of millions; others build in their own
# target directory, fuzz/target-S, so the two do not rebuild each other),
# each with its own corpus (fuzz/corpus/<t>,
# not committed) and artifacts (fuzz/artifacts/<t>). Then a table: target,
# executions, exec/s, coverage (libFuzzer's cov: and ft: of its last
# line), corpus files, findings (crash-, leak-, timeout-, oom-, slow-unit-
# files this run left in fuzz/artifacts/<t>; older ones are counted apart:
# delete them once fixed) and exit status. Extra libFuzzer flags go in FUZZ_FLAGS (e.g. "-max_len=8192").
#
# Exit status: 0 when every target ran clean, 1 when one found something
# or failed, 2 on a usage error, 77 when nightly or cargo-fuzz is missing
# (nothing ran: "skipped", as automake counts it).
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

usage() { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

time_s=60 runs="" sanitizer=address
targets=()
while [ $# -gt 0 ]; do
    case $1 in
        --time) time_s=${2:?--time needs seconds}; runs=""; shift 2 ;;
        --time=*) time_s=${1#--time=}; runs=""; shift ;;
        --runs) runs=${2:?--runs needs a count}; shift 2 ;;
        --runs=*) runs=${1#--runs=}; shift ;;
        --sanitizer) sanitizer=${2:?--sanitizer needs a name}; shift 2 ;;
        --sanitizer=*) sanitizer=${1#--sanitizer=}; shift ;;
        -h|--help) usage ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; usage ;;
        *) targets+=("$1"); shift ;;
    esac
done
for n in "$time_s" ${runs:+"$runs"}; do
    case $n in ''|*[!0-9]*) echo "fuzz.sh: not a number: $n" >&2; exit 2 ;; esac
done

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: skipped: no nightly toolchain (rustup toolchain install nightly)" >&2
    exit 77
fi
if ! cargo fuzz --help >/dev/null 2>&1; then
    echo "fuzz.sh: skipped: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)" >&2
    exit 77
fi

all=$(cargo +nightly fuzz list) || exit 1
if [ ${#targets[@]} -eq 0 ]; then
    read -r -a targets <<<"$(echo $all)"
fi
for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$all" || { echo "fuzz.sh: no target $t (targets: $(echo $all))" >&2; exit 2; }
done

# wdz_* drive the drop-in zlib, which is built apart (C).
if printf '%s\n' "${targets[@]}" | grep -q '^wdz_'; then
    ../scripts/build-wdz.sh >/dev/null || { echo "fuzz.sh: cannot build libwdz.so" >&2; exit 1; }
fi

if [ -n "$runs" ]; then limit="-runs=$runs"; else limit="-max_total_time=$time_s"; fi
build=(-O -s "$sanitizer")
[ "$sanitizer" = address ] || build+=(--target-dir "target-$sanitizer")
logs=target/fuzz-logs
mkdir -p "$logs"
rows=()
failed=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="$logs/$t.log"
    touch "$logs/$t.start"
    echo "== $t ($limit, sanitizer $sanitizer; log: fuzz/$log)"
    # -O: the release profile with debug assertions, as CI builds it.
    if ! cargo +nightly fuzz build "${build[@]}" "$t" >"$log" 2>&1; then
        tail -20 "$log"
        rows+=("$t|-|-|-|-|-|-|build failed")
        failed=1
        continue
    fi
    if compgen -G "regressions/$t/*" >/dev/null; then
        # Given files, libFuzzer runs each once and stops at the first failure.
        if ! cargo +nightly fuzz run "${build[@]}" "$t" regressions/"$t"/* >>"$log" 2>&1; then
            tail -20 "$log"
            rows+=("$t|-|-|-|-|-|-|a regression input fails (fuzz/regressions/$t)")
            failed=1
            continue
        fi
    fi
    # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
    cargo +nightly fuzz run "${build[@]}" "$t" -- "$limit" -rss_limit_mb=2048 -print_final_stats=1 \
        ${FUZZ_FLAGS:-} >>"$log" 2>&1
    rc=$?
    # libFuzzer's last status line: "#N DONE cov: C ft: F corp: ... exec/s: E".
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$last")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    [ -n "$rate" ] || rate=$(sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p' <<<"$last")
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
    corpus=$(find "corpus/$t" -type f | wc -l)
    found() { find "artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' \
        -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) "$@" | wc -l; }
    findings=$(found -newer "$logs/$t.start")
    older=$(( $(found) - findings ))
    status=ok
    if [ "$rc" -ne 0 ]; then status="exit $rc"; failed=1; fi
    if [ "$findings" -gt 0 ]; then
        status="$status, see fuzz/artifacts/$t"
        failed=1
    fi
    if [ "$older" -gt 0 ]; then status="$status ($older older in fuzz/artifacts/$t)"; fi
    rows+=("$t|${execs:--}|${rate:--}|${cov:--}|${ft:--}|$corpus|$findings|$status")
done

echo
{
    echo "target|executions|exec/s|cov|ft|corpus|findings|status"
    printf '%s\n' "${rows[@]}"
} | column -t -s '|'
exit "$failed"
