#!/usr/bin/env bash
# The compression C API (tests/c/test_comp.c, wd_comp.h) and libwdz.so,
# the drop-in zlib: the differential C test (tests/c/test_wdz.c)
# on the CPU path and on a zip device, then unmodified programs through
# LD_PRELOAD compared with stock zlib: python's zlib and gzip modules,
# pigz, git. A program the machine lacks is a counted skip
# ($WD_SKIP_LOG), never a silent pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build-wdz.sh >/dev/null
cargo build --release --locked -q -p wd-cli
lib=$PWD/target/release/libwdz.so
out=$PWD/target/wdz-test
rm -rf "$out"; mkdir -p "$out"
skip() { echo "  skipped: $1"; [ -n "${WD_SKIP_LOG:-}" ] && echo "test-wdz: $1" >> "$WD_SKIP_LOG"; return 0; }
# The shim's counters, checked to show it took work over.
took_over() { # stderr-file
    grep -q "libwdz: taken over" "$1" || { echo "the shim took nothing over:"; cat "$1"; exit 1; }
}

cargo build --release --locked -q -p wd-capi
cc -std=gnu11 -O2 -Wall -Wextra -Werror -Iinclude -rdynamic tests/c/test_wdz.c -lz -ldl -lpthread -o "$out/test_wdz"
cc -std=gnu11 -O2 -Wall -Wextra -Werror -Iinclude tests/c/test_wdz_edges.c -lz -ldl -o "$out/test_wdz_edges"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_comp.c \
    -Ltarget/release -lwd_comp -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_comp"
echo "-- test_comp without a host (counted fallbacks)"
env -u WD_HOST WD_COMP_HOST="$out/none.sock" "$out/test_comp"
echo "-- test_wdz without a host (libdeflate in the calling thread)"
env -u WD_HOST WD_COMP_HOST="$out/none.sock" WDZ_STATS=1 LD_PRELOAD="$lib" "$out/test_wdz" 2> "$out/err"
took_over "$out/err"
echo "-- test_wdz_edges without a host (against a pristine system zlib)"
env -u WD_HOST WD_COMP_HOST="$out/none.sock" LD_PRELOAD="$lib" "$out/test_wdz_edges"

echo "-- test_wdz on a zip device (wd serve)"
./target/release/wd serve --socket "$out/wd.sock" --mode 600 --device zip > "$out/serve.log" 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$out/wd.sock" ] && break; sleep 0.05; done
export WD_HOST="$out/wd.sock"
echo "-- test_comp on the zip device (offload only, no fallback)"
WD_COMP_POLICY=offload WD_COMP_FALLBACK=0 "$out/test_comp"
echo "-- test_comp on the zip device (auto: large blocks cut between the device and the caller)"
"$out/test_comp"
WDZ_STATS=1 WD_COMP_THRESHOLD=0 LD_PRELOAD="$lib" "$out/test_wdz" 2> "$out/err"
took_over "$out/err"
echo "-- test_wdz_edges on the zip device"
WD_COMP_THRESHOLD=0 LD_PRELOAD="$lib" "$out/test_wdz_edges"
# The engine woke for the requests: they reached the device.
wakeups=$(./target/release/wd attr get dev0/engine_wakeups)
[ "$wakeups" -gt 0 ] || { echo "the zip device ran nothing (engine_wakeups=$wakeups)"; exit 1; }


# Data for the programs: text and binaries of this machine.
cat /usr/share/common-licenses/* README.md DESIGN.md > "$out/text"
head -c 4000000 /usr/bin/git >> "$out/text"

echo "-- python zlib and gzip modules"
if command -v python3 >/dev/null; then
    cat > "$out/py.py" <<'PY'
import gzip, sys, zlib
data = open(sys.argv[1], "rb").read()
mode = sys.argv[2]
if mode == "write":
    for lvl in (1, 6, 9):
        open(f"{sys.argv[3]}.z{lvl}", "wb").write(zlib.compress(data, lvl))
    open(sys.argv[3] + ".gz", "wb").write(gzip.compress(data))
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    open(sys.argv[3] + ".raw", "wb").write(c.compress(data) + c.flush())
else:
    for lvl in (1, 6, 9):
        assert zlib.decompress(open(f"{sys.argv[3]}.z{lvl}", "rb").read()) == data, lvl
    g = open(sys.argv[3] + ".gz", "rb").read()
    assert gzip.decompress(g) == data
    assert gzip.decompress(g + g) == data + data
    assert zlib.decompress(open(sys.argv[3] + ".raw", "rb").read(), -15) == data
    d = zlib.decompressobj()
    z = open(f"{sys.argv[3]}.z6", "rb").read()
    out = d.decompress(z, 1000)
    while d.unconsumed_tail:
        out += d.decompress(d.unconsumed_tail, 100000)
    assert out + d.flush() == data
    try:
        zlib.decompress(z[:-100])
        raise SystemExit("truncated input decoded")
    except zlib.error as e:
        assert "incomplete" in str(e) or "truncated" in str(e), e
print("ok")
PY
    # Written through the shim, read by stock zlib; and the other way.
    WDZ_STATS=1 LD_PRELOAD="$lib" python3 "$out/py.py" "$out/text" write "$out/shim" 2> "$out/err"
    took_over "$out/err"
    python3 "$out/py.py" "$out/text" read "$out/shim" >/dev/null
    python3 "$out/py.py" "$out/text" write "$out/stock"
    WDZ_STATS=1 LD_PRELOAD="$lib" python3 "$out/py.py" "$out/text" read "$out/stock" 2> "$out/err" >/dev/null
    took_over "$out/err"
else
    skip "python3 not installed"
fi

echo "-- threads taking turns: a thread's blocks are cut while the others idle"
if [ "$(nproc)" -lt 2 ]; then
    skip "one CPU: blocks are never cut between the device and the caller"
elif command -v python3 >/dev/null; then
    # A worker compresses 16 blocks and idles, alive; then the main thread
    # compresses 16: each is cut (one thread busy, two CPUs).
    cat > "$out/turns.py" <<'PY'
import sys, threading, time, zlib
data = open(sys.argv[1], "rb").read()[:1 << 20]
def burst():
    for i in range(0, len(data), 65536):
        zlib.compress(data[i:i + 65536], 1)
done = threading.Event()
def worker():
    burst()
    done.set()
    time.sleep(1.0)
t = threading.Thread(target=worker)
t.start()
done.wait()
time.sleep(0.3)
burst()
t.join()
PY
    WDZ_STATS=1 LD_PRELOAD="$lib" python3 "$out/turns.py" "$out/text" 2> "$out/err"
    grep -q "; 16 cut between the device and here" "$out/err" || {
        echo "the main thread's blocks were not cut while the worker idled:"; cat "$out/err"; exit 1; }
else
    skip "python3 not installed"
fi

echo "-- pigz"
if command -v pigz >/dev/null; then
    LD_PRELOAD="$lib" pigz -c -p 2 "$out/text" > "$out/text.pigz.gz"
    gzip -dc "$out/text.pigz.gz" | cmp - "$out/text"
    gzip -c "$out/text" > "$out/text.gzip.gz"
    LD_PRELOAD="$lib" pigz -dc "$out/text.gzip.gz" | cmp - "$out/text"
    LD_PRELOAD="$lib" pigz -c -p 2 -z "$out/text" > "$out/text.zz"
    LD_PRELOAD="$lib" pigz -dc -z "$out/text.zz" | cmp - "$out/text"
    # pigz -d decodes through inflateBack: members one after another, and
    # damage refused as stock zlib refuses it.
    cat "$out/text.gzip.gz" "$out/text.pigz.gz" > "$out/two.gz"
    LD_PRELOAD="$lib" pigz -dc "$out/two.gz" | cmp - <(cat "$out/text" "$out/text")
    cp "$out/text.gzip.gz" "$out/bad.gz"
    printf '\377\377\377\377' | dd of="$out/bad.gz" bs=1 seek=$(( $(stat -c %s "$out/bad.gz") / 2 )) conv=notrunc status=none
    if pigz -dc "$out/bad.gz" > /dev/null 2>&1; then stock=0; else stock=$?; fi
    if LD_PRELOAD="$lib" pigz -dc "$out/bad.gz" > /dev/null 2>&1; then shim=0; else shim=$?; fi
    [ "$stock" -ne 0 ] && [ "$shim" = "$stock" ] || { echo "pigz -d of damaged data: exit $shim through the shim, $stock on stock zlib"; exit 1; }
else
    skip "pigz not installed (apt-get install pigz)"
fi

echo "-- git"
if command -v git >/dev/null; then
    repo=$out/repo
    git init -q "$repo"
    cp README.md DESIGN.md "$out/text" "$repo/"
    (cd "$repo" && LD_PRELOAD="$lib" git add . && LD_PRELOAD="$lib" git -c user.name=t -c user.email=t@t commit -qm one)
    git -C "$repo" fsck --strict
    LD_PRELOAD="$lib" git -C "$repo" fsck --strict
    LD_PRELOAD="$lib" git -C "$repo" gc -q
    git -C "$repo" fsck --strict
    LD_PRELOAD="$lib" git clone -q "$repo" "$out/clone"
    cmp "$out/clone/text" "$out/text"
else
    skip "git not installed"
fi
echo "-- curl --compressed (gzip and deflate responses from a local server)"
if command -v curl >/dev/null && command -v python3 >/dev/null; then
    cat > "$out/serve.py" <<'PY'
import gzip, http.server, sys, zlib
data = open(sys.argv[1], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        enc = self.path.strip("/")
        body = gzip.compress(data) if enc == "gzip" else zlib.compress(data)
        self.send_response(200)
        self.send_header("Content-Encoding", enc)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
    python3 "$out/serve.py" "$out/text" > "$out/port" &
    http=$!
    for _ in $(seq 50); do [ -s "$out/port" ] && break; sleep 0.1; done
    port=$(cat "$out/port")
    for enc in gzip deflate; do
        LD_PRELOAD="$lib" curl -sf --compressed "http://127.0.0.1:$port/$enc" -o "$out/curl.$enc"
        cmp "$out/curl.$enc" "$out/text"
    done
    kill "$http"
else
    skip "curl or python3 not installed"
fi
echo "libwdz: all checks passed"
