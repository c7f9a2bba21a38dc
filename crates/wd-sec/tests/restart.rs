//! Long sec requests the engine cuts in pieces that fault after their
//! first piece: which may start over under the stall policy (their pieces
//! changed nothing they read).

mod common;

use common::{cipher, mem, openssl_crypt, session, Mem, BASE};
use openssl::symm::Cipher;
use wd_device::{status, DeviceQueue, Progress, Started};
use wd_ring::Desc;
use wd_sec::msg::{CipherOp, F_ENCRYPT, F_FINAL, F_IV};
use wd_sec::{Alg, SecQueue, TYPE_CIPHER};

const PIECE: u64 = 64 << 10;

/// The queue kinds a test runs on: libcrypto alone, and with the
/// multi-buffer engine where it is installed.
fn queue_engines(test: &str) -> Vec<Option<&'static wd_ipsecmb::Engine>> {
    match common::mb_engine(test) {
        Some(e) => vec![None, Some(e)],
        None => vec![None],
    }
}

/// A whole GCM message of `len` bytes from `from` to `to` (IV 12 bytes
/// of 9), 9 bytes of additional data at `aad`, a 16-byte tag at `tag`.
fn gcm(s: u64, flags: u16, (from, to, len): (u64, u64, usize), aad: u64, tag: u64) -> Desc {
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
        aad_len: 9,
        tag,
        tag_len: 16,
    }
    .encode()
}

/// OpenSSL's sealing of `plain` as [`gcm`] describes it: ciphertext, tag.
fn sealed(key: &[u8], plain: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut tag = vec![0u8; 16];
    let ct = openssl::symm::encrypt_aead(
        Cipher::aes_128_gcm(),
        key,
        Some(&[9u8; 12]),
        b"header 12",
        plain,
        &mut tag,
    )
    .unwrap();
    (ct, tag)
}

/// One piece of `d` as the engine runs it, `done` bytes in.
fn part(q: &mut dyn DeviceQueue, mem: &mut Mem, d: &mut Desc, done: u64) -> Progress {
    q.process_part(d, mem, done, PIECE)
}

/// Run `d` from `done` to its end; its completed descriptor.
fn finish(q: &mut dyn DeviceQueue, mem: &mut Mem, d: Desc, mut done: u64) -> Desc {
    let mut d = d;
    while let Progress::More(n) = part(q, mem, &mut d, done) {
        done = n;
    }
    d
}

/// What the queue says of `d` before each piece after the first, as the
/// engine asks, until it ends: the answers.
fn answers(q: &mut SecQueue, mem: &mut Mem, d: Desc, budget: u64) -> Vec<bool> {
    let (mut d, mut done, mut said) = (d, 0, Vec::new());
    loop {
        if done > 0 {
            said.push(q.restartable(&d));
        }
        match q.process_part(&mut d, mem, done, budget) {
            Progress::More(n) => done = n,
            Progress::Done => break,
        }
    }
    assert_eq!(d.status, 0);
    said
}

/// A cut XTS request and a cut whole GCM decryption may start over when
/// their output does not overlap what they read (a GCM decryption's also
/// while it writes nothing yet: its pieces decrypt into host memory); a
/// cut CBC or CTR request, or a GCM encryption, which moves its session's
/// chain, never; nor does anything the queue is not cutting, nor a
/// hostile descriptor (no panic either). On a multi-buffer queue the
/// answers are the same (the engine stalls nothing there).
#[test]
fn which_cut_requests_may_start_over() {
    const MIB: usize = 1 << 20;
    let (a, b) = (BASE + 0x10_0000, BASE + 0x50_0000);
    let (aad, tag) = (BASE + 0x90_0000, BASE + 0x90_1000);
    for e in queue_engines("which_cut_requests_may_start_over") {
        let mut q = SecQueue::with_engine(TYPE_CIPHER, e);
        let mut mem = mem(12 << 20, true);
        mem.put(aad, b"header 12");
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(29) ^ 0x3c).collect();
        let xts = session(&mut q, &mut mem, Alg::by_name("aes-128-xts").unwrap(), &key);
        let iv = [1u8; 16];
        let go = |from: u64, to: u64| cipher(xts, F_ENCRYPT | F_IV, from, to, 3 * MIB, &iv);
        let what = format!("engine {}", e.is_some());
        let run_xts = |q: &mut SecQueue, mem: &mut Mem, op: CipherOp| {
            let mut d = op.encode();
            if e.is_some() {
                q.batch(1);
                assert_eq!(q.start(0, &mut d, mem), Started::Cut);
            }
            answers(q, mem, d, 1)
        };
        assert_eq!(run_xts(&mut q, &mut mem, go(a, b)), [true; 2], "{what}");
        let back = cipher(xts, F_IV, b, a, 3 * MIB, &iv);
        assert_eq!(run_xts(&mut q, &mut mem, back), [true; 2], "{what}");
        assert_eq!(run_xts(&mut q, &mut mem, go(a, a)), [false; 2], "{what}");
        let shifted = go(a, a + MIB as u64);
        assert_eq!(run_xts(&mut q, &mut mem, shifted), [false; 2], "{what}");
        // Chains cut in pieces.
        for name in ["aes-128-cbc", "aes-128-ctr"] {
            let s = session(&mut q, &mut mem, Alg::by_name(name).unwrap(), &[4; 16]);
            let d = cipher(s, F_IV, a, b, 3 * MIB / 2, &iv).encode();
            let said = answers(&mut q, &mut mem, d, PIECE);
            assert!(!said.is_empty() && !said.contains(&true), "{name} {what}");
        }
        // GCM: a whole decryption, out of place and in place, and an
        // encryption (chained pieces).
        let key = [6u8; 16];
        let g = session(&mut q, &mut mem, Alg::by_name("aes-128-gcm").unwrap(), &key);
        let n = MIB + 13;
        let pieces = n.div_ceil(PIECE as usize);
        let plain = common::data(n, 1);
        let (ct, good) = sealed(&key, &plain);
        mem.put(tag, &good);
        let open = |q: &mut SecQueue, mem: &mut Mem, to: u64| {
            mem.put(a, &ct);
            let mut d = gcm(g, 0, (a, to, n), aad, tag);
            if e.is_some() {
                q.batch(1);
                assert_eq!(q.start(0, &mut d, mem), Started::Cut);
            }
            let said = answers(q, mem, d, PIECE);
            assert!(mem.get(to, n) == plain, "{what}");
            said
        };
        let said = open(&mut q, &mut mem, b);
        assert_eq!(said, vec![true; 2 * pieces - 1], "{what}");
        // In place: until the plaintext starts going out.
        let said = open(&mut q, &mut mem, a);
        let mut want = vec![true; pieces - 1];
        want.extend(vec![false; pieces]);
        assert_eq!(said, want, "{what}");
        // Over its own tag, the same.
        let said = open(&mut q, &mut mem, tag - 4096);
        assert_eq!(said, want, "{what}");
        mem.put(aad, b"header 12");
        mem.put(tag, &good);
        mem.put(b, &plain);
        let seal = gcm(g, F_ENCRYPT, (b, a, n), aad, tag);
        let said = answers(&mut q, &mut mem, seal, PIECE);
        assert!(!said.is_empty() && !said.contains(&true), "{what}");
        // A whole decryption the queue is not cutting (it did not start
        // it): no.
        assert!(!q.restartable(&gcm(g, 0, (a, b, n), aad, tag)), "{what}");
        // Hostile descriptors: refused, never a panic.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..20_000 {
            let mut d = Desc::default();
            for byte in d.payload.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = seed as u8;
            }
            d.opcode = (i % 6) as u16;
            d.flags = (seed >> 8) as u16 & 7;
            assert!(!q.restartable(&d));
        }
        let mut wild = cipher(xts, F_IV, u64::MAX - 8, u64::MAX - 16, 3 * MIB, &iv);
        assert!(!q.restartable(&wild.encode()));
        wild.session = u64::MAX;
        assert!(!q.restartable(&wild.encode()));
    }
}

/// A cut XTS request whose destination faults after its first piece fails
/// with -EFAULT and changed no session: run again from the start, it gives
/// OpenSSL's answer.
#[test]
fn a_cut_xts_request_faulting_later_runs_again_whole() {
    let n = (3 << 20) + 5;
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let iv = [7u8; 16];
    let data = common::data(n, 2);
    let want = openssl_crypt(Cipher::aes_128_xts(), &key, Some(&iv), &data, true);
    let (src, dst) = (BASE + 0x10_0000, BASE + 0x50_0000);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let mut mem = mem(12 << 20, true);
    let s = session(&mut q, &mut mem, Alg::by_name("aes-128-xts").unwrap(), &key);
    mem.put(src, &data);
    let op = cipher(s, F_ENCRYPT | F_IV, src, dst, n, &iv).encode();
    let mut d = op;
    let Progress::More(done) = q.process_part(&mut d, &mut mem, 0, 1) else {
        panic!("cut")
    };
    assert!(q.restartable(&op));
    mem.set_hole(Some((dst + (2 << 20), dst + (2 << 20) + 4096)));
    let d = {
        let (mut d, mut done) = (d, done);
        while let Progress::More(x) = q.process_part(&mut d, &mut mem, done, 1) {
            done = x;
        }
        d
    };
    assert_eq!(d.status, status::EFAULT);
    mem.set_hole(None);
    let d = finish(&mut q, &mut mem, op, 0);
    assert_eq!((d.status, d.result), (0, n as u64));
    assert!(mem.get(dst, n) == want);
}
