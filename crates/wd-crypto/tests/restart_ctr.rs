//! A CTR stream whose last device request ended inside a keystream block,
//! continued on the device after the host restarted (its lane made again
//! under a new id), against OpenSSL: it used to start the new lane at the
//! block boundary, ignoring the bytes already used of that block.

use std::time::Duration;

use openssl::symm::{Cipher as OCipher, Crypter, Mode as OMode};
use wd_crypto::{config, Cipher, Direction, Policy};

fn reference_ctr(key: &[u8], iv: &[u8], data: &[u8]) -> Vec<u8> {
    let mut c = Crypter::new(OCipher::aes_128_ctr(), OMode::Encrypt, key, Some(iv)).unwrap();
    let mut out = vec![0u8; data.len() + 16];
    let n = c.update(data, &mut out).unwrap();
    out.truncate(n);
    out
}

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
fn ctr_partial_block_survives_a_restart() {
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    let dir = wd_testutil::tempdir("wd-ctr-restart");
    let sock = dir.join("wd.sock");
    let spawn = || wd_testutil::Role::serving("host", &sock);
    std::env::set_var("WD_CRYPTO_HOST", &sock);
    let mut first = spawn();

    let key = [7u8; 16];
    let iv = [0x42u8; 16];
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let want = reference_ctr(&key, &iv, &data);
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
