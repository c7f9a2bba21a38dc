//! CPU fallback: with no host at all, and when the host is killed in the
//! middle of a chained stream (the stream goes on, correct, on the CPU,
//! and every fallback is counted); and a stream that goes on on the
//! restarted host's device.

use std::time::Duration;

use openssl::symm::{Cipher as OCipher, Crypter, Mode as OMode};
use wd_crypto::{config, stats, Cipher, Digest, Direction, Policy};

/// The tests set the host to talk to in the environment and count
/// fallbacks: one at a time.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// OpenSSL's encryption of `data` (no padding).
fn reference(cipher: OCipher, key: &[u8], iv: Option<&[u8]>, data: &[u8]) -> Vec<u8> {
    let mut c = Crypter::new(cipher, OMode::Encrypt, key, iv).unwrap();
    c.pad(false);
    let mut out = vec![0u8; data.len() + 16];
    let n = c.update(data, &mut out).unwrap();
    out.truncate(n);
    out
}

/// The host process: this test binary re-run in the role "host" (see
/// wd_testutil::Role); does nothing in a normal test run.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host") {
        return;
    }
    let cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("sec")],
        ..Default::default()
    };
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

#[test]
fn fallbacks_are_correct_and_counted() {
    let _env = serial();
    config::set_policy(Policy::Offload);
    config::set_threshold(0);

    // 1. No host: everything on the CPU, counted as "no queue".
    std::env::set_var("WD_CRYPTO_HOST", "/nonexistent/wd.sock");
    let key = [3u8; 16];
    let iv = [9u8; 16];
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let want = reference(OCipher::aes_128_cbc(), &key, Some(&iv), &data);
    let before = stats();
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    c.update(&data, &mut out).unwrap();
    assert_eq!(out, want);
    let mut d = Digest::new("sha256", &[]).unwrap();
    d.update(b"abc").unwrap();
    assert_eq!(d.finish().unwrap()[0], 0xba);
    let s = stats();
    assert!(s.cpu_no_queue - before.cpu_no_queue >= 2, "{s:?}");
    // Configured not to fall back: a clear error instead.
    config::set_fallback(false);
    let mut strict = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    strict.set_iv(&iv).unwrap();
    let e = strict.update(&data[..4096], &mut out[..4096]).unwrap_err();
    assert!(e.to_string().contains("WD_CRYPTO_FALLBACK"), "{e}");
    let mut d = Digest::new("sha256", &[]).unwrap();
    d.update(b"abc").unwrap();
    assert!(d.finish().is_err());
    config::set_fallback(true);
    assert_eq!(s.offload_requests, before.offload_requests);
    drop(c);
    // The failure is remembered for a while; let it pass before the next part.
    std::thread::sleep(Duration::from_millis(1100));

    // 2. A host in another process, killed in the middle of a stream.
    let dir = wd_testutil::tempdir("wd-crypto-fallback");
    let sock = dir.join("wd.sock");
    // A host process on `sock` (killed on drop), returned once it serves.
    let spawn = || wd_testutil::Role::serving("host", &sock);
    let mut host = spawn();
    std::env::set_var("WD_CRYPTO_HOST", &sock);
    let before = stats();
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let half = data.len() / 2;
    let mut out = vec![0u8; data.len()];
    c.update(&data[..half], &mut out[..half]).unwrap();
    let mid = stats();
    assert!(
        mid.offload_bytes - before.offload_bytes >= half as u64,
        "{mid:?}"
    );
    // The process's counters are visible in the host's tree (wd ls).
    let h = wrapdrive::HostConn::connect(&sock).unwrap();
    let shown: Vec<_> = h
        .attrs("dev0/queues/")
        .unwrap()
        .into_iter()
        .filter(|e| e.path.ends_with("/client/cpu_no_queue"))
        .collect();
    assert!(
        shown
            .iter()
            .any(|e| e.value.parse::<u64>().unwrap_or(0) >= 2),
        "fallback counters not in the attribute tree: {shown:?}"
    );
    drop(h);
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    c.update(&data[half..], &mut out[half..]).unwrap();
    assert_eq!(out, want, "the chain survives the host's death");
    let after = stats();
    assert!(after.cpu_host_gone - mid.cpu_host_gone >= 1, "{after:?}");
    drop(host);

    // 3. The host killed and started again on the same socket: the stream
    // goes on (the request that meets the restart on the CPU, from the
    // chain it saved), then on the device again with a session opened on
    // the new host.
    std::thread::sleep(Duration::from_millis(1100));
    let mut first = spawn();
    let quarter = data.len() / 4;
    let mut out = vec![0u8; data.len()];
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let s0 = stats();
    c.update(&data[..quarter], &mut out[..quarter]).unwrap();
    assert!(stats().offload_bytes - s0.offload_bytes >= quarter as u64);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let _second = spawn();
    c.update(&data[quarter..2 * quarter], &mut out[quarter..2 * quarter])
        .unwrap();
    // Past the lane's retry delay, the device again.
    std::thread::sleep(Duration::from_millis(1100));
    let s1 = stats();
    c.update(&data[2 * quarter..], &mut out[2 * quarter..])
        .unwrap();
    assert!(
        stats().offload_bytes - s1.offload_bytes >= 2 * quarter as u64,
        "{:?}",
        stats()
    );
    assert_eq!(out, want, "the chain survives the host's restart");
    let h = wrapdrive::HostConn::connect(&sock).unwrap();
    assert_ne!(
        h.get_attr("dev0/sessions").unwrap(),
        "0",
        "a session on the new host"
    );
    drop(h);

    // 4. The same through shared memory the device works in in place: the
    // request that meets the restart is redone on the CPU from its intact
    // input, then the device works in place on the new host.
    std::thread::sleep(Duration::from_millis(1100));
    let src = wrapdrive::SharedBuf::new(data.len()).unwrap();
    let dst = wrapdrive::SharedBuf::new(data.len()).unwrap();
    src.write(0, &data);
    let (src, dst) = (
        wrapdrive::SharedSpan::of(&src),
        wrapdrive::SharedSpan::of(&dst),
    );
    let piece = |i: u64| {
        (
            src.sub(i * quarter as u64, quarter as u64),
            dst.sub(i * quarter as u64, quarter as u64),
        )
    };
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let s0 = stats();
    let (i, o) = piece(0);
    c.update_shared(i, o).unwrap();
    assert_eq!(
        stats().offload_in_place_bytes - s0.offload_in_place_bytes,
        quarter as u64
    );
    drop(_second);
    let _third = spawn();
    let (i, o) = piece(1);
    c.update_shared(i, o).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let s1 = stats();
    for p in 2..4 {
        let (i, o) = piece(p);
        c.update_shared(i, o).unwrap();
    }
    assert_eq!(
        stats().offload_in_place_bytes - s1.offload_in_place_bytes,
        2 * quarter as u64,
        "in place again on the new host: {:?}",
        stats()
    );
    assert_eq!(dst.len(), data.len() as u64);
    let mut got = vec![0u8; data.len()];
    dst.read(0, &mut got);
    assert_eq!(got, want, "the chain survives the restart in place");
}

/// A CTR stream whose last device request ended inside a keystream block,
/// continued on the device after the host restarted (its lane made again
/// under a new id), against OpenSSL: it used to start the new lane at the
/// block boundary, ignoring the bytes already used of that block.
#[test]
fn ctr_partial_block_survives_a_restart() {
    let _env = serial();
    let (_dir, spawn) = offloading_to_hosts("wd-fallback-ctr");
    let mut first = spawn();

    let key = [7u8; 16];
    let iv = [0x42u8; 16];
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let want = reference(OCipher::aes_128_ctr(), &key, Some(&iv), &data);
    let mut out = vec![0u8; data.len()];

    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    // 100 bytes on the device: 6 blocks and 4 bytes of the 7th.
    c.update(&data[..100], &mut out[..100]).unwrap();

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let _second = spawn();

    // Another session of this thread meets the restart (redone on the CPU;
    // the lane is dropped and made again later).
    let mut other = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
    let mut o = vec![0u8; 4096];
    other.update(&data[..4096], &mut o).unwrap();
    std::thread::sleep(Duration::from_millis(1100));

    // The CTR stream goes on, on the device of the new host.
    c.update(&data[100..], &mut out[100..]).unwrap();
    assert_eq!(&out[..100], &want[..100]);
    let first_bad = out.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        first_bad, None,
        "CTR stream after the restart differs from OpenSSL"
    );
}

/// Every request to the device, of a host process started for the test.
fn offloading_to_a_host(name: &str) -> (wd_testutil::TempDir, wd_testutil::Role) {
    let (dir, spawn) = offloading_to_hosts(name);
    let host = spawn();
    (dir, host)
}

/// As [`offloading_to_a_host`], for a test that restarts its host: each
/// call of `spawn` starts one at the same socket.
fn offloading_to_hosts(name: &str) -> (wd_testutil::TempDir, impl Fn() -> wd_testutil::Role) {
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    let dir = wd_testutil::tempdir(name);
    let sock = dir.join("wd.sock");
    std::env::set_var("WD_CRYPTO_HOST", &sock);
    (dir, move || wd_testutil::Role::serving("host", &sock))
}

/// A new GCM message after the host died, with the fallback on, runs here
/// (nothing of it lived in the host): a seal's first device request met
/// the dead host and failed with HostGone (an open fell back).
#[test]
fn a_new_gcm_message_after_the_host_died_runs_here() {
    use openssl::symm::encrypt_aead;
    let _env = serial();
    let (_dir, mut host) = offloading_to_a_host("wd-fallback-gcm");
    let (key, iv, aad) = ([5u8; 16], [7u8; 12], b"header");
    // Longer than a device request carries: counted whole all the same.
    let pt: Vec<u8> = (0..200 << 10).map(|i: u32| (i * 31 + 1) as u8).collect();
    let mut want_tag = [0u8; 16];
    let want = encrypt_aead(
        OCipher::aes_128_gcm(),
        &key,
        Some(&iv),
        aad,
        &pt,
        &mut want_tag,
    )
    .unwrap();
    let mut a = wd_crypto::Aead::new("aes-128-gcm", &key).unwrap();
    let seal = |a: &mut wd_crypto::Aead| {
        let (mut ct, mut tag) = (vec![0u8; pt.len()], [0u8; 16]);
        a.seal(&iv, aad, &pt, &mut ct, &mut tag).map(|()| (ct, tag))
    };
    let s0 = stats();
    assert_eq!(seal(&mut a).unwrap(), (want.clone(), want_tag));
    assert!(
        stats().offload_bytes > s0.offload_bytes,
        "the first message on the device"
    );
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    let s1 = stats();
    assert_eq!(seal(&mut a).unwrap(), (want, want_tag));
    let s2 = stats();
    assert_eq!(s2.cpu_host_gone - s1.cpu_host_gone, 1, "{s2:?}");
    assert_eq!(s2.cpu_bytes - s1.cpu_bytes, pt.len() as u64, "{s2:?}");
}

/// A CBC job lost with its host (finish: HostGone) ends its message, as a
/// request the device failed does: the stream went on, with success, from
/// the chain before the lost job (output neither OpenSSL's stream nor a
/// new message).
#[test]
fn a_job_lost_with_its_host_ends_the_message() {
    let _env = serial();
    let (_dir, mut host) = offloading_to_a_host("wd-fallback-lost-job");
    let (key, iv) = ([9u8; 16], [3u8; 16]);
    let n = 64 << 10;
    let data: Vec<u8> = (0..3 * n as u32).map(|i| (i * 11 + 7) as u8).collect();
    let want = reference(OCipher::aes_128_cbc(), &key, Some(&iv), &data);
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    c.update_offload(&data[..n], &mut out[..n]).unwrap();
    assert_eq!(&out[..n], &want[..n]);
    // The host stops answering, then dies with the job.
    let pid = host.child.id().to_string();
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status();
    assert!(stopped.unwrap().success());
    let job = c
        .start_offload(&data[n..2 * n], &mut out[n..2 * n])
        .unwrap();
    assert!(!job.is_done());
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    assert!(c.finish(job, &mut out[n..2 * n]).is_err());
    let rest = &mut out[2 * n..];
    assert!(
        c.update(&data[2 * n..], rest).is_err(),
        "the stream went on after a lost job"
    );
    // A new message goes on (here: no host).
    let iv2 = [4u8; 16];
    c.set_iv(&iv2).unwrap();
    c.update(&data[2 * n..], rest).unwrap();
    assert!(rest == &reference(OCipher::aes_128_cbc(), &key, Some(&iv2), &data[2 * n..])[..]);
}

/// Jobs in flight when the host restarts, dropped once the lane's queue
/// was made again on the new host (the lane under a new id), give their
/// staging slots back: 64 jobs of 64 KiB are then on the device at once,
/// with OpenSSL's output. (They were skipped as another lane's, their
/// slots held for the lane's life.)
#[test]
fn jobs_lost_at_a_restart_leave_no_slot_taken() {
    let _env = serial();
    let (_dir, spawn) = offloading_to_hosts("wd-fallback-restart-slots");
    config::set_fallback(true);
    let mut first = spawn();
    let key = [3u8; 16];
    let data: Vec<u8> = (0..64 << 10u32).map(|i| (i * 5 + 1) as u8).collect();
    // On a thread of its own: a lane of its own, made on the first host.
    std::thread::scope(|t| {
        t.spawn(|| {
            let mut c = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            let mut outs = vec![vec![0u8; data.len()]; 8];
            // The session on the first host, which then stops: the jobs
            // stay in flight until it is killed.
            c.update(&data, &mut outs[0]).unwrap();
            let pid = first.child.id();
            let stopped = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status();
            assert!(stopped.unwrap().success());
            wd_testutil::wait_stopped(pid as i32);
            let mut jobs: Vec<_> = outs
                .iter_mut()
                .map(|o| c.start_offload(&data, o).unwrap())
                .collect();
            assert!(jobs.iter().all(|j| !j.is_done()), "on the device");
            first.child.kill().unwrap();
            first.child.wait().unwrap();
            let _second = spawn();
            // The first meets the restart (the queue is made again, the
            // lane lives on under a new id); the others, sent under the
            // former id, are dropped.
            let rest = jobs.split_off(1);
            let _ = c.finish(jobs.pop().unwrap(), &mut vec![0u8; data.len()]);
            drop(rest);
            // Until the thread's lane is back on the new host (a lane
            // dropped meanwhile is asked for again a second later).
            let mut probe = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            let mut po = vec![0u8; 4096];
            let back = (0..50).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                let j = probe.start_offload(&data[..4096], &mut po).unwrap();
                let on_device = !j.is_done();
                probe.finish(j, &mut po).unwrap();
                on_device
            });
            assert!(back, "no lane on the new host within 5 s");
            let want = reference(OCipher::aes_128_ecb(), &key, None, &data);
            let mut c = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            let mut outs = vec![vec![0u8; data.len()]; 64];
            let mut jobs = Vec::new();
            for (i, o) in outs.iter_mut().enumerate() {
                match c.start_offload(&data, o) {
                    Ok(j) => {
                        assert!(!j.is_done(), "job {i} ran here");
                        jobs.push(j);
                    }
                    Err(e) => panic!("job {i} of 64 after the restart: {e:?}"),
                }
            }
            for (j, o) in jobs.into_iter().zip(outs.iter_mut()) {
                c.finish(j, o).unwrap();
                assert!(*o == want);
            }
        });
    });
}

/// Two jobs in flight at a restart: finishing the first makes the queue
/// again on the restarted host (the lane lives on, under a new id); a job
/// sent then completes on the new host even when the second old job is
/// finished before it. Finishing that one (sent under the former id) must
/// not drop the thread's lane: its host-gone error came out of the lane's
/// closure, so the lane and the new job on it went (reported lost with
/// its host, which lives).
#[test]
fn a_job_lost_at_a_restart_leaves_the_new_lane_alone() {
    let _env = serial();
    let (_dir, spawn) = offloading_to_hosts("wd-fallback-restart-lane");
    config::set_fallback(true);
    let mut first = spawn();
    let key = [5u8; 16];
    let data: Vec<u8> = (0..64 << 10u32).map(|i| (i * 3 + 7) as u8).collect();
    let want = reference(OCipher::aes_128_ecb(), &key, None, &data);
    std::thread::scope(|t| {
        t.spawn(|| {
            let mut ca = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            let mut cb = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            // Long jobs (the large staging area), still on the device at
            // the kill.
            let long: Vec<u8> = (0..8 << 20u32).map(|i| (i * 11 + 1) as u8).collect();
            let mut oa = vec![0u8; long.len()];
            let mut ob = vec![0u8; long.len()];
            // Sessions on the first host, which then stops: the jobs stay
            // in flight until it is killed.
            ca.update(&data, &mut oa[..data.len()]).unwrap();
            cb.update(&data, &mut ob[..data.len()]).unwrap();
            let pid = first.child.id();
            let st = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .unwrap();
            assert!(st.success());
            wd_testutil::wait_stopped(pid as i32);
            let ja = ca.start_offload(&long, &mut oa).unwrap();
            let jb = cb.start_offload(&long, &mut ob).unwrap();
            assert!(!ja.is_done() && !jb.is_done(), "on the device");
            first.child.kill().unwrap();
            first.child.wait().unwrap();
            let _second = spawn();
            // Meets the restart while waiting: the queue is made again.
            assert!(ca.finish(ja, &mut oa).is_err(), "lost with the first host");
            // Sent under the lane's new id, on the live host.
            let mut c2 = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
            let mut o2 = vec![0u8; data.len()];
            let j2 = c2.start_offload(&data, &mut o2).unwrap();
            assert!(!j2.is_done(), "the new job on the device");
            assert!(cb.finish(jb, &mut ob).is_err(), "lost with the first host");
            let r = c2.finish(j2, &mut o2);
            assert!(r.is_ok(), "the job sent after the restart: {r:?}");
            assert!(o2 == want);
        });
    });
}
