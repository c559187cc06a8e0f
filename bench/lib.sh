# Helpers shared by the bench scripts (sourced, not run).
# ms CMD...: run CMD with stdout discarded, print its wall time in milliseconds.
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
# drop: write back and drop the page cache (cold runs).
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# ratio A B: A / B with two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
# report LABEL UBTRFS_MS KERNEL_MS
report() { echo "$1: ubtrfs $2 ms, kernel $3 ms, ratio $(ratio "$2" "$3")x"; }
