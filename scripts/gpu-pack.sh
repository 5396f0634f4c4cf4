#!/usr/bin/env bash
# Builds the workspace's release test executables and binaries on a machine with Rust, strips
# them and packs them into .gpu/ for a GPU machine that has no Rust toolchain.
#
#   bash scripts/gpu-pack.sh                  # every crate
#   bash scripts/gpu-pack.sh -p calico -p calico-conformance   # fewer test executables
#
# Extra arguments go to `cargo test --no-run` (the binaries are always built). Then, from the
# repository root of a copy of the tree on the GPU machine:
#   bash .gpu/run.sh tests                    # every test executable (GPU tests included)
#   bash .gpu/run.sh tests conformance [ARGS] # those whose file name contains "conformance",
#                                             # each given ARGS (e.g. a test filter, --nocapture)
#   bash .gpu/run.sh bin calico bench --out reports   # one binary with its arguments
# GPU_PACK_DIR names another output folder than .gpu (it must be ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${GPU_PACK_DIR:-.gpu}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/tests" "$staging/bin"

# Reads cargo's JSON messages and prints the executables it built: test harnesses when $1 is
# "tests", other executables (the [[bin]] targets) when it is "bin".
executables() {
  python3 -c '
import json, sys
want_tests = sys.argv[1] == "tests"
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe:
        if bool(msg.get("profile", {}).get("test")) == want_tests:
            print(exe)
' "$1"
}

# With no arguments every crate's tests; cargo ignores -p next to --workspace, so arguments
# replace it.
(($# > 0)) || set -- --workspace
echo "gpu-pack: building release test executables" >&2
cargo test --release --no-run --message-format=json-render-diagnostics "$@" \
  | executables tests | sort -u >"$staging/tests.txt"
echo "gpu-pack: building release binaries" >&2
cargo build --release --workspace --bins --message-format=json-render-diagnostics \
  | executables bin | sort -u >"$staging/bins.txt"
xargs -r -a "$staging/tests.txt" cp -t "$staging/tests/"
xargs -r -a "$staging/bins.txt" cp -t "$staging/bin/"
# Debug symbols are most of each file's size; the GPU machine only runs them.
for f in "$staging"/tests/* "$staging"/bin/*; do
  [[ -f "$f" ]] && strip --strip-debug "$f"
done

mkdir -p "$out"
tar -C "$staging" -czf "$out/bundle.tgz" tests bin
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Made by scripts/gpu-pack.sh: unpacks bundle.tgz and runs its tests or one of its binaries.
#   run.sh tests [NAME-PART [ARGS...]] | run.sh bin NAME [ARGS...]
# Run it from the repository root; tests and binaries run there.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
unpacked=$(mktemp -d /tmp/calico-gpu.XXXXXX)
tar -C "$unpacked" -xzf "$here/bundle.tgz"
command -v nvidia-smi >/dev/null && nvidia-smi -L
mode=${1:-}
shift || true
case "$mode" in
  tests)
    part=${1:-}
    shift || true
    failed=()
    ran=0
    for t in "$unpacked"/tests/*; do
      name=$(basename "$t")
      [[ -z "$part" || "$name" == *"$part"* ]] || continue
      echo "==== $name"
      ran=$((ran + 1))
      "$t" "$@" || failed+=("$name")
    done
    echo "==== $ran test executables run, ${#failed[@]} failed${failed:+: ${failed[*]}}"
    ((ran > 0 && ${#failed[@]} == 0))
    ;;
  bin)
    name=${1:?run.sh bin NAME [ARGS...]}
    shift
    exec "$unpacked/bin/$name" "$@"
    ;;
  *)
    echo "usage: run.sh tests [NAME-PART [ARGS...]] | run.sh bin NAME [ARGS...]" >&2
    exit 2
    ;;
esac
RUN
chmod +x "$out/run.sh"
mib=$(( $(stat -c %s "$out/bundle.tgz") / 1048576 ))
echo "gpu-pack: $out/bundle.tgz: $(wc -l <"$staging/tests.txt") test executables, $(wc -l <"$staging/bins.txt") binaries, $mib MiB" >&2
if ((mib >= 60)); then
  echo "gpu-pack: the bundle is $mib MiB; pass -p CRATE to pack fewer test executables" >&2
  exit 1
fi
