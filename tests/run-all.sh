#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine that has the Rust toolchain:
#   tests/run-all.sh               build, start a private PostgreSQL, run every test, stop it
#   tests/run-all.sh --under-load  the same, with one busy loop per core running beside the
#                                  tests (a shared CI runner's situation): no test may decide by
#                                  a quiet window or a race with the wall clock
#   tests/run-all.sh bench         the same cluster, then the benches instead of the tests
# PostgreSQL, nginx, openssl, curl, chromium, chromium-driver, iproute2, nftables and python3-venv
# come from Debian's packages (installed if missing); the Python tools the API's fuzz test runs
# (Schemathesis, openapi-python-client) from PyPI at pinned versions into a venv under
# target/python-tools (tests/python-tools/install.sh, skipped when up to date). The tests start their
# own private nginx per test on a free loopback port, whatever the package's service does. The cluster lives under
# target/pg-test (or a private temp folder when the postgres user cannot reach target/), listens
# only on 127.0.0.1 on a free port, and is stopped on exit whatever happens.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-test}
case "$mode" in
  test | bench | --under-load) ;;
  *) echo "usage: tests/run-all.sh [--under-load | bench]" >&2; exit 2 ;;
esac

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
missing=()
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then missing+=(postgresql); fi
if [ "$mode" != bench ] && [ ! -x /usr/sbin/nginx ]; then missing+=(nginx); fi
# The nginx example's check makes a test certificate with openssl.
if [ "$mode" != bench ] && ! command -v openssl >/dev/null; then missing+=(openssl); fi
# The console's tests drive Debian's headless chromium through chromedriver (WebDriver).
if [ "$mode" != bench ] && ! command -v chromium >/dev/null; then missing+=(chromium); fi
if [ "$mode" != bench ] && ! command -v chromedriver >/dev/null; then missing+=(chromium-driver); fi
# The getting-started test runs the tutorial's commands as written, curl among them.
if [ "$mode" != bench ] && ! command -v curl >/dev/null; then missing+=(curl); fi
# The partition test makes network namespaces (iproute2's ip) and drops packets with nftables.
if [ "$mode" != bench ] && ! command -v ip >/dev/null; then missing+=(iproute2); fi
if [ "$mode" != bench ] && ! command -v nft >/dev/null; then missing+=(nftables); fi
# The API's fuzz and generated-client tests run Python tools in a venv of their own
# (tests/python-tools/install.sh, below); Debian's python3 makes venvs only with python3-venv.
if [ "$mode" != bench ]; then
  if ! command -v python3 >/dev/null; then
    missing+=(python3 python3-venv)
  else
    probe=$(mktemp -d)
    python3 -m venv "$probe/venv" >/dev/null 2>&1 || missing+=(python3-venv)
    rm -rf "$probe"
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} from Debian's packages"
  as_root apt-get update -qq
  # The packages must not start their services (the tests start their own servers, and a
  # service that fails to start on a container would fail the install): policy-rc.d says no,
  # unless the machine already has a policy of its own.
  policy=/usr/sbin/policy-rc.d
  own_policy=""
  if [ ! -e "$policy" ]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
    own_policy=yes
  fi
  installed=0
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || installed=$?
  if [ -n "$own_policy" ]; then as_root rm -f "$policy"; fi
  [ "$installed" -eq 0 ] || { echo "installing ${missing[*]} failed" >&2; exit "$installed"; }
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

if [ "$mode" != bench ]; then
  # Pinned versions from PyPI, made once and kept while requirements.txt stays the same.
  export REINS_PYTHON_TOOLS=${REINS_PYTHON_TOOLS:-$root/target/python-tools}
  tests/python-tools/install.sh
fi

# PostgreSQL refuses to run as root: as root, the cluster belongs to the postgres user.
run_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_dir="$root/target/pg-test"
mkdir -p "$root/target"
rm -rf "$pg_dir"
mkdir -p "$pg_dir"
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$pg_dir"
  if ! runuser -u postgres -- test -w "$pg_dir"; then
    rm -rf "$pg_dir"
    pg_dir=$(mktemp -d /tmp/reins-pg-test.XXXXXX)
    chown postgres: "$pg_dir"
    echo "== the postgres user cannot reach target/; the cluster lives in $pg_dir"
  fi
fi

port=""
for _ in $(seq 1 50); do
  candidate=$((20000 + RANDOM % 40000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[ -n "$port" ] || { echo "no free loopback port found" >&2; exit 1; }

stop_pg() { run_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true; }
busy=()
stop_all() {
  if [ ${#busy[@]} -gt 0 ]; then kill "${busy[@]}" 2>/dev/null || true; fi
  stop_pg
}
trap stop_all EXIT

echo "== PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($pg_dir)"
run_pg "$pg_bin/initdb" -D "$pg_dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
settings=(-c listen_addresses=127.0.0.1 -c port="$port" -c unix_socket_directories="$pg_dir"
          -c max_connections=400 -c shared_buffers=128MB)
if [ "$mode" != bench ]; then
  # Tests check behaviour, not durability against power loss; benchmarks keep the defaults.
  settings+=(-c fsync=off -c synchronous_commit=off -c full_page_writes=off)
fi
run_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -o "${settings[*]}" start >/dev/null

url="postgres://postgres@127.0.0.1:$port/postgres"
case "$mode" in
  bench)
    REINS_BENCH_PG="$url" cargo bench -p store --bench fenced_write
    REINS_BENCH_PG="$url" cargo bench -p actors --bench child_runs
    REINS_BENCH_PG="$url" cargo bench -p actors --bench workflows
    REINS_BENCH_PG="$url" cargo bench -p api --bench http
    REINS_BENCH_PG="$url" cargo bench -p api --bench wake
    REINS_BENCH_PG="$url" cargo bench -p api --bench soak
    ;;
  *)
    cargo build --workspace --bins
    if [ "$mode" = --under-load ]; then
      # After the builds (which would only be slower): the tests alone meet the busy cores.
      cargo test --workspace --no-run
      for _ in $(seq 1 "$(nproc)"); do
        bash -c 'while :; do :; done' &
        busy+=($!)
      done
      echo "== under load: ${#busy[@]} busy loops (one per core) beside the tests"
    fi
    log="$pg_dir/cargo-test.log"
    set +e
    REINS_TEST_PG="$url" cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    # One closing line over every test binary, so the total is not hidden behind the last
    # (often empty) doc-test run.
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
         END { printf "total: %d passed, %d failed\n", p, f }' "$log"
    exit "$status"
    ;;
esac
