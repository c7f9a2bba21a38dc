//! What the sec device's tests share: client memory at an IOVA base
//! (`wd_testutil::FlatMemory`) that a test lets the device reach in place
//! and hold, or only by copies, and the requests every test sends first.
#![allow(dead_code)]

use wd_device::{DeviceQueue, Progress};
use wd_ring::Desc;
use wd_sec::msg::{CipherOp, SessionNew, F_FINAL, F_IV};
use wd_sec::{Alg, SecQueue};
pub use wd_testutil::dma::FlatMemory as Mem;

pub const BASE: u64 = 0x10_0000;

/// `size` bytes at [`BASE`]; `direct`: the device may work in place and
/// hold memory, else it goes through copies.
pub fn mem(size: usize, direct: bool) -> Mem {
    let mut m = Mem::new(BASE, size);
    set_direct(&mut m, direct);
    m
}

/// Switch between the two memory paths.
pub fn set_direct(m: &mut Mem, direct: bool) {
    m.set_slices(direct);
    m.set_holds(direct);
}

pub fn run(q: &mut SecQueue, mem: &mut Mem, d: Desc) -> Desc {
    let mut d = d;
    q.process(&mut d, mem);
    d
}

pub fn session(q: &mut SecQueue, mem: &mut Mem, alg: Alg, key: &[u8]) -> u64 {
    let key_addr = BASE + 0x8000;
    mem.put(key_addr, key);
    let d = run(q, mem, SessionNew::new(alg, key, key_addr).encode());
    assert_eq!(d.status, 0, "session for {}", alg.name());
    d.result
}

/// A cipher request with no additional data or tag; the IV travels only
/// with `F_IV`.
pub fn cipher(session: u64, flags: u16, src: u64, dst: u64, len: usize, iv: &[u8]) -> CipherOp {
    let mut ivb = [0u8; 16];
    ivb[..iv.len()].copy_from_slice(iv);
    CipherOp {
        session,
        flags,
        src,
        dst,
        len: len as u64,
        iv: ivb,
        iv_len: if flags & F_IV != 0 { iv.len() as u8 } else { 0 },
        aad: 0,
        aad_len: 0,
        tag: 0,
        tag_len: 0,
    }
}

/// Run a request as the engine runs a synchronous queue's: in pieces of
/// `budget` bytes (the device's smallest piece at least); the completed
/// descriptor and how many calls it took.
pub fn run_in_pieces(q: &mut SecQueue, mem: &mut Mem, d: Desc, budget: u64) -> (Desc, usize) {
    let (mut d, mut done, mut calls) = (d, 0, 1);
    while let Progress::More(n) = q.process_part(&mut d, mem, done, budget) {
        assert!(n > done, "no progress");
        done = n;
        calls += 1;
    }
    (d, calls)
}

/// OpenSSL's output for `data` in one go, without padding.
pub fn openssl_crypt(
    c: openssl::symm::Cipher,
    key: &[u8],
    iv: Option<&[u8]>,
    data: &[u8],
    encrypt: bool,
) -> Vec<u8> {
    use openssl::symm::{Crypter, Mode};
    let mode = if encrypt {
        Mode::Encrypt
    } else {
        Mode::Decrypt
    };
    let mut cr = Crypter::new(c, mode, key, iv).unwrap();
    cr.pad(false);
    let mut out = vec![0u8; data.len() + 32];
    let n = cr.update(data, &mut out).unwrap();
    let m = cr.finalize(&mut out[n..]).unwrap();
    out.truncate(n + m);
    out
}

/// The multi-buffer engine, or a reported skip where it is not installed.
pub fn mb_engine(test: &str) -> Option<&'static wd_ipsecmb::Engine> {
    match wd_ipsecmb::Engine::get() {
        Ok(e) => Some(e),
        Err(e) => {
            wd_testutil::skip(test, &e.to_string());
            None
        }
    }
}

/// The queue kinds a test runs on: libcrypto only, and the multi-buffer
/// engine where it is here (a skip reported for `test` where not).
pub fn queue_engines(test: &str) -> Vec<Option<&'static wd_ipsecmb::Engine>> {
    match mb_engine(test) {
        Some(e) => vec![None, Some(e)],
        None => vec![None],
    }
}

/// A whole GCM message (IV 9 repeated, with the tag): `len` bytes from
/// `from` to `to`, additional data at `aad`, the tag at `tag`.
pub fn gcm_message(
    s: u64,
    flags: u16,
    (from, to, len): (u64, u64, usize),
    (aad, aad_len): (u64, u32),
    (tag, tag_len): (u64, u8),
) -> Desc {
    let mut iv = [0u8; 16];
    iv[..12].copy_from_slice(&[9u8; 12]);
    CipherOp {
        session: s,
        flags: flags | F_IV | F_FINAL,
        src: from,
        dst: to,
        len: len as u64,
        iv,
        iv_len: 12,
        aad,
        aad_len,
        tag,
        tag_len,
    }
    .encode()
}

/// Test data: `n` bytes that differ with `seed`.
pub fn data(n: usize, seed: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 131 + seed * 17) % 251) as u8)
        .collect()
}

/// Stop the queue (teardown) and say how each request it held came back:
/// `(token, status, result)`, in token order.
pub fn abort_outcomes(q: &mut SecQueue) -> Vec<(u64, i32, u64)> {
    let mut stopped = Vec::new();
    q.abort(&mut stopped);
    stopped.sort_by_key(|(t, _)| *t);
    stopped
        .iter()
        .map(|(t, d)| (*t, d.status, d.result))
        .collect()
}
