//! A device stream whose compressor lost a queue while the host lives
//! (same connection epoch): it never runs in another stream's session.

use std::time::Duration;

use wd_comp::{Algorithm, Compressor, Config, Flush, Op, Policy, StreamParams};
use wd_testutil::text as data;
use wrapdrive::HostConn;

/// A host whose limits refuse more than 16 MiB of client memory mapped.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host-limited") {
        return;
    }
    let mut cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("zip")],
        ..Default::default()
    };
    cfg.limits.exempt_owner = false;
    cfg.limits.mapped_bytes_per_uid = 16 << 20;
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

fn decode_zlib(z: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut v = Vec::new();
    flate2::read::ZlibDecoder::new(z).read_to_end(&mut v)?;
    Ok(v)
}

fn run(c: &mut Compressor, s: &mut wd_comp::Stream, input: &[u8], flush: Flush, out: &mut Vec<u8>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0;
    loop {
        let st = c.stream_run(s, &input[at..], &mut buf, flush).unwrap();
        at += st.consumed;
        out.extend_from_slice(&buf[..st.produced]);
        if st.end || (flush != Flush::Finish && at == input.len() && st.produced < buf.len()) {
            break;
        }
    }
}

/// An asynchronous request whose staging area the host refuses made the
/// compressor drop its synchronous queue too, with a device stream's
/// session on it; a second later a new queue on the same connection (same
/// epoch) gave a new stream a session with the same handle as the first
/// stream's old one (each queue's table starts alike), and the first
/// stream's next call ran in the second stream's session: both came out
/// wrong, with success. Now the synchronous queue stays, and a session is
/// bound to its lane, not only to the epoch.
#[test]
fn a_stream_whose_queue_was_dropped_never_runs_in_another_streams_session() {
    let dir = std::env::temp_dir().join(format!("wd-comp-lost-lane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("wd.sock").display().to_string();
    let _host = wd_testutil::Role::serving("host-limited", &socket);
    let mut c = Compressor::new(
        Some(HostConn::connect(&socket).unwrap()),
        Config {
            policy: Policy::Offload,
            threshold: 0,
            fallback: true,
            depth: 2,
            journal_limit: wd_comp::DEFAULT_JOURNAL_LIMIT,
            split_min: 0,
        },
    );
    let p = StreamParams {
        alg: Algorithm::Zlib,
        compress: true,
        level: 6,
        window_bits: 0,
        dict: &[],
    };
    let a_in = data(100_000, 1);
    let b_in = data(100_000, 2);
    let mut a = c.open_stream(&p).unwrap();
    assert!(a.on_device());
    let mut za = Vec::new();
    run(&mut c, &mut a, &a_in[..50_000], Flush::Sync, &mut za);

    // A large started request: its staging area (32 MiB) passes the
    // host's limit; computed here, and the compressor's queues dropped.
    let big = data(4 << 20, 3);
    let mut out = vec![0u8; 12 << 20];
    let pend = c
        .start(Op::Compress(1), Algorithm::Gzip, &big, &mut out)
        .unwrap();
    assert!(pend.is_done(), "the started request went to the device");
    c.finish(pend, &mut out).unwrap();

    std::thread::sleep(wd_comp::RETRY_AFTER + Duration::from_millis(200));
    let mut b = c.open_stream(&p).unwrap();
    assert!(b.on_device(), "the second stream is on a new queue");
    let mut zb = Vec::new();
    run(&mut c, &mut b, &b_in[..50_000], Flush::Sync, &mut zb);

    run(&mut c, &mut a, &a_in[50_000..], Flush::Finish, &mut za);
    run(&mut c, &mut b, &b_in[50_000..], Flush::Finish, &mut zb);
    eprintln!("stats {:?} a.on_device={}", c.stats(), a.on_device());
    let back_a = decode_zlib(&za);
    let back_b = decode_zlib(&zb);
    assert!(
        back_a.as_ref().is_ok_and(|v| *v == a_in),
        "stream A came out wrong: {:?}",
        back_a.map(|v| v.len())
    );
    assert!(
        back_b.as_ref().is_ok_and(|v| *v == b_in),
        "stream B came out wrong: {:?}",
        back_b.map(|v| v.len())
    );
}
