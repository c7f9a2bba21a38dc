//! Device sessions end with their objects, whichever thread drops them:
//! a cipher is `Send`, but only the thread whose lane holds its session
//! may submit there.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use wd_crypto::{config, Cipher, Digest, Direction, Policy};

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

/// Sessions of ciphers and digests dropped on another thread stayed on
/// the device as long as the thread that opened them lived (a pool
/// thread's: for ever); they are freed at that thread's next call.
#[test]
fn sessions_dropped_on_another_thread_are_freed_by_their_lanes_thread() {
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    let dir = wd_testutil::tempdir("wd-crypto-sessions");
    let sock = dir.join("wd.sock");
    std::env::set_var("WD_CRYPTO_HOST", &sock);
    let _host = wd_testutil::Role::serving("host", &sock);
    let h = wrapdrive::HostConn::connect(&sock).unwrap();
    let sessions = || h.get_attr("dev0/sessions").unwrap().parse::<u64>().unwrap();
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while sessions() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        sessions(),
        0,
        "the sessions of objects dropped on another thread are freed"
    );
    drop(go_on);
    worker.join().unwrap();
}
