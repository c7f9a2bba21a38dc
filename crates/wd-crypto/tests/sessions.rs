//! Device sessions end with their objects, whichever thread drops them:
//! a cipher is `Send`, but only the thread whose lane holds its session
//! may submit there.
#![allow(unsafe_code)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use wd_crypto::{config, Cipher, Digest, Direction, Job, Policy};

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

/// The tests name their host in the environment: one at a time.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A host of its own for a test (held by the guard), every request
/// offloaded; the device's session count.
struct Offloading {
    _env: std::sync::MutexGuard<'static, ()>,
    _dir: wd_testutil::TempDir,
    _host: wd_testutil::Role,
}

fn offloading(name: &str) -> (Offloading, impl Fn() -> u64) {
    let env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    let dir = wd_testutil::tempdir(name);
    let sock = dir.join("wd.sock");
    std::env::set_var("WD_CRYPTO_HOST", &sock);
    let host = wd_testutil::Role::serving("host", &sock);
    let h = wrapdrive::HostConn::connect(&sock).unwrap();
    let sessions = move || h.get_attr("dev0/sessions").unwrap().parse::<u64>().unwrap();
    let held = Offloading {
        _env: env,
        _dir: dir,
        _host: host,
    };
    (held, sessions)
}

/// Wait (5 s at most) for the device to hold no session.
fn until_none(sessions: &impl Fn() -> u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while sessions() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    sessions()
}

/// Many sessions left on a lane by another thread (more than its queue
/// holds) are all freed at the lane thread's next call, which works: the
/// frees were sent at once, those past the queue's room lost and the
/// call's own request refused ("queue full").
#[test]
fn a_burst_of_sessions_dropped_elsewhere_is_freed_and_the_next_call_works() {
    let (_host, sessions) = offloading("wd-crypto-sessions-burst");
    const N: usize = 300;
    let (give, take) = mpsc::channel::<Vec<Cipher>>();
    let (go_on, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<Result<(), String>>();
    let worker = std::thread::spawn(move || {
        let mut out = [0u8; 4096];
        let ciphers: Vec<Cipher> = (0..N)
            .map(|_| {
                let mut c = Cipher::new("aes-128-cbc", &[1; 16], Direction::Encrypt).unwrap();
                c.set_iv(&[2; 16]).unwrap();
                c.update(&[7; 4096], &mut out).unwrap();
                c
            })
            .collect();
        give.send(ciphers).unwrap();
        wait.recv().unwrap();
        let mut c = Cipher::new("aes-128-ctr", &[1; 16], Direction::Encrypt).unwrap();
        c.set_iv(&[2; 16]).unwrap();
        let r = c
            .update(&[7; 4096], &mut out)
            .map(|_| ())
            .map_err(|e| e.to_string());
        drop(c);
        done.send(r).unwrap();
        let _ = wait.recv();
    });
    let ciphers = take.recv().unwrap();
    assert!(sessions() >= N as u64);
    drop(ciphers);
    go_on.send(()).unwrap();
    assert_eq!(finished.recv().unwrap(), Ok(()), "the next call");
    assert_eq!(until_none(&sessions), 0, "sessions left");
    drop(go_on);
    worker.join().unwrap();
}

/// A job carried to another thread, as the C API can: refused there.
struct Carried(Job);
// SAFETY: the job is only finished (refused) on the other thread, which
// is what is tested; its parts are never reached from there.
unsafe impl Send for Carried {}

/// A job finished on another thread than its lane's is refused, and its
/// cipher's session on that lane is freed by the lane's thread (it was
/// forgotten, and stayed for the lane's life).
#[test]
fn a_job_finished_elsewhere_leaves_no_session_behind() {
    let (_host, sessions) = offloading("wd-crypto-sessions-job");
    let (give, take) = mpsc::channel::<(Cipher, Carried)>();
    let (go_on, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let data = vec![7u8; 64 << 10];
        let mut out = vec![0u8; data.len()];
        let mut c = Cipher::new("aes-128-cbc", &[1; 16], Direction::Encrypt).unwrap();
        c.set_iv(&[2; 16]).unwrap();
        let j = c.start_offload(&data, &mut out).unwrap();
        assert!(!j.is_done(), "on the device");
        give.send((c, Carried(j))).unwrap();
        wait.recv().unwrap();
        let mut c = Cipher::new("aes-128-ctr", &[1; 16], Direction::Encrypt).unwrap();
        c.set_iv(&[2; 16]).unwrap();
        c.update(&data, &mut out).unwrap();
        drop(c);
        done.send(()).unwrap();
        let _ = wait.recv();
    });
    let (mut c, Carried(j)) = take.recv().unwrap();
    let mut out = vec![0u8; 64 << 10];
    let e = c.finish(j, &mut out).unwrap_err();
    assert!(e.to_string().contains("another thread"), "{e}");
    drop(c);
    go_on.send(()).unwrap();
    finished.recv().unwrap();
    assert_eq!(until_none(&sessions), 0, "sessions left");
    drop(go_on);
    worker.join().unwrap();
}

/// Sessions of ciphers and digests dropped on another thread stayed on
/// the device as long as the thread that opened them lived (a pool
/// thread's: for ever); they are freed at that thread's next call.
#[test]
fn sessions_dropped_on_another_thread_are_freed_by_their_lanes_thread() {
    let (_host, sessions) = offloading("wd-crypto-sessions");
    const N: usize = 8;
    let data = vec![7u8; 64 << 10];

    let (give, take) = mpsc::channel::<(Vec<Cipher>, Vec<Digest>)>();
    let (go_on, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let worker = {
        let data = data.clone();
        std::thread::spawn(move || {
            let mut out = vec![0u8; data.len()];
            let ciphers: Vec<Cipher> = (0..N)
                .map(|_| {
                    let mut c = Cipher::new("aes-128-cbc", &[1; 16], Direction::Encrypt).unwrap();
                    c.set_iv(&[2; 16]).unwrap();
                    c.update(&data, &mut out).unwrap();
                    c
                })
                .collect();
            let digests: Vec<Digest> = (0..N)
                .map(|_| {
                    let mut d = Digest::new("sha256", &[]).unwrap();
                    d.update(&data).unwrap();
                    d
                })
                .collect();
            give.send((ciphers, digests)).unwrap();
            wait.recv().unwrap();
            // Any call on the lanes frees what was left there.
            let mut c = Cipher::new("aes-128-ctr", &[1; 16], Direction::Encrypt).unwrap();
            c.set_iv(&[2; 16]).unwrap();
            c.update(&data, &mut out).unwrap();
            drop(c);
            let mut d = Digest::new("sha256", &[]).unwrap();
            d.update(&data).unwrap();
            d.finish().unwrap();
            done.send(()).unwrap();
            // The thread (and its lanes) lives on.
            let _ = wait.recv();
        })
    };
    let (ciphers, digests) = take.recv().unwrap();
    let open = sessions();
    assert!(open >= 2 * N as u64, "{open} sessions on the device");
    drop(ciphers);
    drop(digests);
    go_on.send(()).unwrap();
    finished.recv().unwrap();
    assert_eq!(
        until_none(&sessions),
        0,
        "the sessions of objects dropped on another thread are freed"
    );
    drop(go_on);
    worker.join().unwrap();
}
