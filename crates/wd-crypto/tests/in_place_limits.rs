//! In place where the host will not map a whole arena: a host whose
//! per-uid mapping limit leaves room for the staging area only. The lane
//! opens with its staging area alone, buffers of shared memory go through
//! the staging area, on the device still, and every byte is right.

use openssl::symm::{Cipher as OCipher, Crypter, Mode as OMode};
use wd_crypto::{config, stats, Cipher, Direction, Policy};

/// The host process: this test binary re-run in the role "host" (see
/// wd_testutil::Role); does nothing in a normal test run.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host") {
        return;
    }
    let mut cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("sec")],
        ..Default::default()
    };
    // Room for the 4 MiB staging area, not for a 64 MiB arena.
    cfg.limits.mapped_bytes_per_uid = 8 << 20;
    cfg.limits.exempt_owner = false;
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

#[test]
fn a_host_that_maps_no_arena_gets_staged_requests() {
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    config::set_fallback(false);
    let dir = wd_testutil::tempdir("wd-crypto-limits");
    let sock = dir.join("wd.sock");
    let _host = wd_testutil::Role::serving("host", &sock);
    std::env::set_var("WD_CRYPTO_HOST", &sock);

    let (key, iv) = ([5u8; 16], [6u8; 16]);
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 13 + 1) as u8).collect();
    let mut want = vec![0u8; data.len() + 16];
    let mut o = Crypter::new(OCipher::aes_128_cbc(), OMode::Encrypt, &key, Some(&iv)).unwrap();
    o.pad(false);
    let n = o.update(&data, &mut want).unwrap();
    want.truncate(n);

    let src = wrapdrive::SharedBuf::new(data.len()).unwrap();
    let dst = wrapdrive::SharedBuf::new(data.len()).unwrap();
    src.write(0, &data);
    let (src, dst) = (
        wrapdrive::SharedSpan::of(&src),
        wrapdrive::SharedSpan::of(&dst),
    );
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let before = stats();
    let piece = data.len() as u64 / 4;
    for p in 0..4 {
        c.update_shared(src.sub(p * piece, piece), dst.sub(p * piece, piece))
            .unwrap();
    }
    let after = stats();
    assert_eq!(
        after.offload_bytes - before.offload_bytes,
        data.len() as u64,
        "{after:?}"
    );
    assert_eq!(
        after.offload_in_place_bytes, before.offload_in_place_bytes,
        "{after:?}"
    );
    assert_eq!(after.cpu_requests, before.cpu_requests, "{after:?}");
    let mut got = vec![0u8; data.len()];
    dst.read(0, &mut got);
    assert_eq!(got, want);

    // A job of 6 MiB, the stream going on: this lane has no large staging
    // area (the host maps no more), so the job goes to the device a window
    // at a time, fallback on or not, never to the CPU (it was computed
    // there: Busy for ever on 64 slots).
    config::set_fallback(true);
    let long: Vec<u8> = (0..6 << 20u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut want = vec![0u8; long.len() + 16];
    let n = o.update(&long, &mut want).unwrap();
    want.truncate(n);
    let before = stats();
    let mut out = vec![0u8; long.len()];
    let j = c.start_offload(&long, &mut out).unwrap();
    c.finish(j, &mut out).unwrap();
    let after = stats();
    config::set_fallback(false);
    assert_eq!(after.cpu_bytes, before.cpu_bytes, "{after:?}");
    assert!(out == want, "the 6 MiB job's output");
}
