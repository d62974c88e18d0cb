#!/usr/bin/env bash
# Mutation check: does the CPU test suite notice a plausible one-line bug in the math?
#
# Run by hand (not in CI):
#   scripts/mutation-check.sh                    # every mutant of scripts/mutants.txt
#   scripts/mutation-check.sh sinkhorn-extra-pass clamp-7   # only these ids
#   DS4_MUTATION_DIR=/tmp/m scripts/mutation-check.sh       # work directory (default /tmp/ds4-mutation)
#   DS4_MUTATION_JOBS=4 scripts/mutation-check.sh           # ninja/ctest parallelism (default 2)
#   DS4_MUTATION_SKIP_FAILING=1 scripts/mutation-check.sh   # leave out tests that fail unmutated
#
# What it does:
#   1. copies the working tree (tracked and untracked-but-not-ignored files, i.e. what you would
#      commit) into $DS4_MUTATION_DIR/src, writing only files whose bytes differ so that a second
#      run rebuilds only what changed; the working tree itself is never modified;
#   2. configures a CPU-only Release build in $DS4_MUTATION_DIR/build, builds every CPU test
#      binary (tests/*_test.cpp) and runs the CPU suite once: it must pass (a failing baseline
#      stops the run and names the failing tests, unless DS4_MUTATION_SKIP_FAILING=1, which
#      leaves those tests, and test binaries that do not build, out of every later run and says
#      so);
#   3. for each mutant: replaces its `original` text (which must occur exactly once in the file)
#      by `replacement`, rebuilds incrementally, runs the tests whose binaries were relinked
#      (a binary that does not contain the mutated code cannot change its verdict), the fast
#      ones first, stopping at the first failure, and restores the file;
#   4. prints one line per mutant and the kill rate, and writes the table to
#      $DS4_MUTATION_DIR/result.md (copy it into docs/mutation-check.md when it is a new record).
#
# Verdicts: KILLED (a test failed), SURVIVED (every affected test passed: a gap, or an
# equivalent mutant that must be explained), STILLBORN (does not compile: not counted),
# STALE (the original text is no longer in the file: update scripts/mutants.txt; not counted).
#
# Mutant list (scripts/mutants.txt): one mutant per line, fields separated by " ||| ":
#   id ||| file ||| original ||| replacement ||| what it breaks
# In original/replacement, <NL> stands for a newline (for swapping two lines). Lines starting
# with # and blank lines are ignored.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${DS4_MUTATION_DIR:-/tmp/ds4-mutation}
jobs=${DS4_MUTATION_JOBS:-2}
list=${DS4_MUTATION_LIST:-$root/scripts/mutants.txt}
src=$work/src
build=$work/build
mkdir -p "$src" "$build"
cp "$list" "$work/mutants.txt"  # edits to the list during a run do not disturb it
list=$work/mutants.txt

# Only files whose bytes differ are written (with a new time stamp), so the build stays
# incremental and a file left mutated by an interrupted run is always rebuilt once restored.
echo "mutation-check: syncing $root -> $src"
(cd "$root" && git ls-files -co --exclude-standard -z) | python3 -c '
import os, shutil, sys
root, src = sys.argv[1], sys.argv[2]
for rel in sys.stdin.buffer.read().decode().split("\0"):
    a, b = os.path.join(root, rel), os.path.join(src, rel)
    if not rel or not os.path.isfile(a):
        continue
    if os.path.isfile(b) and open(a, "rb").read() == open(b, "rb").read():
        continue
    os.makedirs(os.path.dirname(b), exist_ok=True)
    shutil.copyfile(a, b)
    shutil.copymode(a, b)
' "$root" "$src"

cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS4_ENABLE_CUDA=OFF >"$work/configure.log" 2>&1 ||
    { echo "mutation-check: configure failed, see $work/configure.log"; exit 2; }
mapfile -t targets < <(cd "$src/tests" && ls ./*_test.cpp | sed 's|^\./||; s|\.cpp$||')

stamp() {  # "name mtime" of every test binary
    for t in "${targets[@]}"; do
        [[ -x $build/tests/$t ]] && echo "$t $(stat -c %Y.%y "$build/tests/$t")" || echo "$t missing"
    done
}

exclude='^consumer_'
run_tests() {  # run_tests REGEX [STOP] [EXCLUDE] -> 0 when every selected test passes
    (cd "$build" && ctest -L cpu -E "${3:-$exclude}" -R "$1" -j "$jobs" ${2:---stop-on-failure} --timeout 600 \
        --output-on-failure >"$work/ctest.log" 2>&1)
}
failed_tests() { { grep -oE "Test +#[0-9]+: [a-z0-9_]+ .*(Failed|Timeout|Exception)" "$work/ctest.log" || true; } | awk '{print $3}'; }

echo "mutation-check: baseline build (${#targets[@]} test binaries)"
if ! ninja -C "$build" -j "$jobs" -k 0 "${targets[@]}" >"$work/build.log" 2>&1; then
    built=()
    for t in "${targets[@]}"; do [[ -x $build/tests/$t ]] && built+=("$t"); done
    echo "mutation-check: the unmutated tree does not build everything, see $work/build.log"
    [[ ${DS4_MUTATION_SKIP_FAILING:-0} == 1 && ${#built[@]} -gt 0 ]] || exit 2
    echo "mutation-check: leaving out $(comm -23 <(printf '%s\n' "${targets[@]}" | sort) <(printf '%s\n' "${built[@]}" | sort) | paste -sd' ' -) (DS4_MUTATION_SKIP_FAILING=1)"
    targets=("${built[@]}")
fi
all_regex="^($(IFS='|'; echo "${targets[*]}"))\$"
if ! run_tests "$all_regex" --no-tests=error; then
    bad=$(failed_tests | paste -sd'|' -)
    echo "mutation-check: the unmutated suite fails: ${bad:-see $work/ctest.log}"
    [[ ${DS4_MUTATION_SKIP_FAILING:-0} == 1 && -n $bad ]] || exit 2
    exclude="^consumer_|^($bad)\$"
    echo "mutation-check: leaving out $bad (DS4_MUTATION_SKIP_FAILING=1): mutants only they would kill survive"
fi

# Tests over 5 s in the baseline run after the others, so that most kills cost seconds.
slow=$({ grep -oE "Test +#[0-9]+: [a-z0-9_]+ .*Passed +[0-9.]+ sec" "$work/ctest.log" || true; } |
       awk '$(NF-1) > 5 {print $3}' | paste -sd'|' -)
[[ -n $slow ]] && echo "mutation-check: slow tests run last: $slow"
run_mutant_tests() {  # run_mutant_tests REGEX -> 0 when every selected test passes
    if [[ -n $slow ]]; then run_tests "$1" --stop-on-failure "$exclude|^($slow)\$" || return 1; fi
    run_tests "$1"
}

# The mutant ids to run: all, or those named on the command line.
declare -A wanted=()
for id in "$@"; do wanted[$id]=1; done

apply_mutant() {  # apply_mutant FILE ORIGINAL REPLACEMENT -> 0 applied, 3 stale
    python3 - "$1" "$2" "$3" <<'EOF'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("<NL>", "\n"), sys.argv[3].replace("<NL>", "\n")
text = open(path, encoding="utf-8").read()
if text.count(old) != 1:
    sys.exit(3)
open(path, "w", encoding="utf-8").write(text.replace(old, new, 1))
EOF
}

killed=0 survived=0 stillborn=0 stale=0
survivors=()
result=$work/result.md
{
    echo "| mutant | file | verdict | first failing test | what it breaks |"
    echo "| --- | --- | --- | --- | --- |"
} >"$result"

while IFS= read -r line; do
    [[ -z ${line// } || $line == \#* ]] && continue
    IFS=$'\x1f' read -r id file original replacement note <<<"${line// ||| /$'\x1f'}"
    [[ ${#wanted[@]} -gt 0 && -z ${wanted[$id]:-} ]] && continue
    path=$src/$file
    verdict="" first=""
    if [[ ! -f $root/$file || ! -f $path ]]; then  # the copy may keep files the tree has deleted
        verdict=STALE
    else
        cp -p "$path" "$work/original.bak"
        before=$(stamp)
        if ! apply_mutant "$path" "$original" "$replacement"; then
            verdict=STALE
        elif ! ninja -C "$build" -j "$jobs" "${targets[@]}" >"$work/build.log" 2>&1; then
            verdict=STILLBORN
        else
            after=$(stamp)
            changed=$({ diff <(echo "$before") <(echo "$after") || true; } | sed -n 's/^> \([^ ]*\) .*/\1/p' | paste -sd'|' -)
            if [[ -z $changed ]]; then
                verdict=SURVIVED first="(no test binary contains this code)"
            elif run_mutant_tests "^($changed)\$"; then
                verdict=SURVIVED
            else
                verdict=KILLED
                first=$(failed_tests | head -1)
            fi
        fi
        # Restore with a fresh time stamp so the next build recompiles what the mutant touched.
        cp "$work/original.bak" "$path"
        touch "$path"
    fi
    case $verdict in
        KILLED) killed=$((killed + 1)) ;;
        SURVIVED) survived=$((survived + 1)); survivors+=("$id") ;;
        STILLBORN) stillborn=$((stillborn + 1)) ;;
        STALE) stale=$((stale + 1)) ;;
    esac
    printf '%-10s %-34s %-28s %s\n' "$verdict" "$id" "$first" "$file"
    echo "| $id | $file | $verdict | $first | $note |" >>"$result"
done <"$list"

# Leave the build matching the unmutated tree for the next run.
ninja -C "$build" -j "$jobs" "${targets[@]}" >"$work/build.log" 2>&1 || true

counted=$((killed + survived))
rate=$(awk -v k=$killed -v n=$counted 'BEGIN { printf "%.1f", n ? 100 * k / n : 0 }')
summary="killed $killed of $counted ($rate%); stillborn $stillborn, stale $stale (not counted)"
echo "mutation-check: $summary"
[[ ${#survivors[@]} -gt 0 ]] && echo "mutation-check: survivors: ${survivors[*]}"
{
    echo
    echo "Result: $summary. Survivors: ${survivors[*]:-none}."
} >>"$result"
echo "mutation-check: table written to $result"
