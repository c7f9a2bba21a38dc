//! Device streams against the codec alone: a call longer than a request
//! carries writes the codec's bytes, and a flush is done when the call
//! returns with room left.

use wd_comp::{Algorithm, Compressor, Config, Flush, Policy, StreamParams};
use wd_testutil::text as data;
use wrapdrive::HostConn;

#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host") {
        return;
    }
    let cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("zip")],
        ..Default::default()
    };
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

struct HostProc {
    _process: wd_testutil::Role,
    socket: String,
}

fn spawn_host(name: &str) -> HostProc {
    let dir = std::env::temp_dir().join(format!("wd-comp-calls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("wd.sock").display().to_string();
    HostProc {
        _process: wd_testutil::Role::serving("host", &socket),
        socket,
    }
}

fn offload_cfg() -> Config {
    Config {
        policy: Policy::Offload,
        threshold: 0,
        fallback: false,
        depth: 8,
        journal_limit: wd_comp::DEFAULT_JOURNAL_LIMIT,
        split_min: 0,
    }
}

/// Feed all of `piece` with `flush` as zlib's deflate is fed (call again
/// while input is left or the output filled), then finish.
fn run_all(c: &mut Compressor, s: &mut wd_comp::Stream, pieces: &[&[u8]], flush: Flush) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for (i, p) in pieces.iter().enumerate() {
        let f = if i + 1 == pieces.len() {
            Flush::Finish
        } else {
            flush
        };
        let mut at = 0;
        loop {
            let st = c.stream_run(s, &p[at..], &mut buf, f).unwrap();
            at += st.consumed;
            out.extend_from_slice(&buf[..st.produced]);
            if st.end || (f != Flush::Finish && at == p.len() && st.produced < buf.len()) {
                break;
            }
            assert!(st.consumed + st.produced > 0, "no progress");
        }
    }
    out
}

/// A sync (or full) flush after a call's input longer than the device
/// stream's half slot (32 KiB): the client sends the first 32 KiB with the
/// caller's flush, so the device flushes in the middle of the caller's
/// input, once per 32 KiB: other bytes than the same call on the codec.
#[test]
fn a_flush_after_more_than_a_slot_of_input_is_the_codecs_stream() {
    let text = data(300_000, 41);
    let host = spawn_host("flush");
    let mut dev = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let mut cpu = Compressor::new(
        None,
        Config {
            policy: Policy::Cpu,
            ..Config::default()
        },
    );
    for flush in [Flush::Sync, Flush::Full] {
        let p = StreamParams {
            alg: Algorithm::Zlib,
            compress: true,
            level: 6,
            window_bits: 0,
            dict: &[],
        };
        let mut a = dev.open_stream(&p).unwrap();
        let mut b = cpu.open_stream(&p).unwrap();
        assert!(a.on_device() && !b.on_device());
        let pieces: Vec<&[u8]> = vec![&text[..200_000], &text[200_000..]];
        let za = run_all(&mut dev, &mut a, &pieces, flush);
        let zb = run_all(&mut cpu, &mut b, &pieces, flush);
        assert!(
            za == zb,
            "{flush:?}: device stream {} bytes, codec stream {} bytes: they differ",
            za.len(),
            zb.len()
        );
    }
}

/// zlib's contract for a sync flush: when the call returns with room left
/// in the output, all input was taken and everything so far is written
/// (ending on the empty stored block `00 00 ff ff`). A device stream's
/// request carries at most half a slot (32 KiB) of output: a sync flush
/// whose output is longer returns with most of the caller's room unused
/// and the flush's end held back, and a caller that stops there (as zlib
/// callers do) sends a message the peer cannot finish decoding.
#[test]
fn a_sync_flush_that_returns_with_room_left_has_written_everything() {
    let noise = wd_testutil::noise(32 << 10, 7);
    let host = spawn_host("syncroom");
    let mut dev = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let mut cpu = Compressor::new(
        None,
        Config {
            policy: Policy::Cpu,
            ..Config::default()
        },
    );
    let p = StreamParams {
        alg: Algorithm::Deflate,
        compress: true,
        level: 6,
        window_bits: 0,
        dict: &[],
    };
    for (name, c) in [("cpu", &mut cpu), ("device", &mut dev)] {
        let mut s = c.open_stream(&p).unwrap();
        let mut out = vec![0u8; 1 << 20];
        let st = c.stream_run(&mut s, &noise, &mut out, Flush::Sync).unwrap();
        assert_eq!(st.consumed, noise.len(), "{name}");
        assert!(st.produced < out.len(), "{name}");
        assert!(
            out[..st.produced].ends_with(&[0, 0, 0xff, 0xff]),
            "{name}: returned {} bytes with {} bytes of room left, the sync flush not written out",
            st.produced,
            out.len() - st.produced
        );
    }
}
