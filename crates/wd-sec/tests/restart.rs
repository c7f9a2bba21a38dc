//! Long sec requests the engine cuts in pieces that fault after their
//! first piece: which may start over under the stall policy (their pieces
//! changed nothing they read), and the host memory a cut GCM decryption
//! holds, counted against the device's budget and given back however the
//! request ends.

mod common;

use common::{cipher, gcm_message, mem, openssl_crypt, queue_engines, session, Mem, BASE};
use openssl::symm::Cipher;
use wd_device::{status, DeviceQueue, Driver, Progress, Started};
use wd_ring::Desc;
use wd_sec::msg::{CipherOp, SessionNew, F_ENCRYPT, F_FINAL, F_IV};
use wd_sec::{Alg, EngineChoice, SecDriver, SecQueue, TYPE_CIPHER};

const PIECE: u64 = 64 << 10;

/// OpenSSL's sealing of `plain` as `gcm_message` makes it (9 bytes of
/// additional data): ciphertext, tag.
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
            let mut d = gcm_message(g, 0, (a, to, n), (aad, 9), (tag, 16));
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
        let seal = gcm_message(g, F_ENCRYPT, (b, a, n), (aad, 9), (tag, 16));
        let said = answers(&mut q, &mut mem, seal, PIECE);
        assert!(!said.is_empty() && !said.contains(&true), "{what}");
        // A whole decryption the queue is not cutting (it did not start
        // it): no.
        assert!(
            !q.restartable(&gcm_message(g, 0, (a, b, n), (aad, 9), (tag, 16))),
            "{what}"
        );
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

/// The `open_bytes` attribute of a driver: the plaintext its queues' cut
/// GCM decryptions hold.
fn open_bytes(drv: &SecDriver) -> u64 {
    let attrs = drv.attributes();
    let (_, v, _) = attrs.iter().find(|(k, _, _)| k == "open_bytes").unwrap();
    v.parse().unwrap()
}

fn new_session(q: &mut dyn DeviceQueue, mem: &mut Mem, key: &[u8]) -> u64 {
    let key_addr = BASE + 0x8000;
    let mut d = SessionNew::new(Alg::by_name("aes-128-gcm").unwrap(), key, key_addr).encode();
    q.process(&mut d, mem);
    assert_eq!(d.status, 0);
    d.result
}

/// The plaintext a cut GCM decryption holds between passes counts against
/// the device's budget, shared by its queues: one that does not fit is
/// refused with -ENOSPC before it changes anything (nothing written, its
/// session's message under way kept), and the budget comes back however
/// the holder ends (done, wrong tag, fault, its queue closed, a restart
/// from the start, which counts once), so that one sent again runs.
#[test]
fn a_cut_gcm_decryption_counts_its_plaintext_against_the_device() {
    let n = (3 << 20) / 2;
    let drv = SecDriver::new(EngineChoice::Libcrypto)
        .unwrap()
        .with_open_memory(2 << 20);
    let key = [8u8; 16];
    let plain = common::data(n, 5);
    let (ct, good) = sealed(&key, &plain);
    let (src, dst, aad, tag) = (
        BASE + 0x10_0000,
        BASE + 0x30_0000,
        BASE + 0x7c_0000,
        BASE + 0x7c_1000,
    );
    let mut mem = mem(8 << 20, true);
    mem.put(aad, b"header 12");
    mem.put(tag, &good);
    let mut one = drv.open_queue(TYPE_CIPHER);
    let mut two = drv.open_queue(TYPE_CIPHER);
    let s1 = new_session(&mut *one, &mut mem, &key);
    let s2 = new_session(&mut *two, &mut mem, &key);
    let op1 = gcm_message(s1, 0, (src, dst, n), (aad, 9), (tag, 16));
    let op2 = gcm_message(s2, 0, (src, dst + (2 << 20), n), (aad, 9), (tag, 16));
    let fresh = |mem: &mut Mem| {
        mem.put(src, &ct);
        mem.put(dst, &vec![0xee; (2 << 20) + n]);
    };
    // The first holds its plaintext; the second does not fit.
    let refused = |two: &mut dyn DeviceQueue, mem: &mut Mem| {
        let mut d = op2;
        assert_eq!(part(two, mem, &mut d, 0), Progress::Done);
        assert_eq!((d.status, d.result), (status::ENOSPC, 0));
        assert!(mem.get(dst + (2 << 20), n).iter().all(|&b| b == 0xee));
    };
    let started = |one: &mut dyn DeviceQueue, two: &mut dyn DeviceQueue, mem: &mut Mem| {
        fresh(mem);
        let mut d = op1;
        let mut done = 0;
        for _ in 0..3 {
            let Progress::More(x) = part(one, mem, &mut d, done) else {
                panic!("cut")
            };
            done = x;
        }
        assert_eq!(open_bytes(&drv), n as u64);
        refused(two, mem);
        (d, done)
    };
    // Done: the budget is back and the second runs.
    let (d, done) = started(&mut *one, &mut *two, &mut mem);
    let d = finish(&mut *one, &mut mem, d, done);
    assert_eq!(d.status, 0);
    assert!(mem.get(dst, n) == plain);
    assert_eq!(open_bytes(&drv), 0);
    let d = finish(&mut *two, &mut mem, op2, 0);
    assert_eq!(d.status, 0, "the second, sent again, runs");
    assert!(mem.get(dst + (2 << 20), n) == plain);
    assert_eq!(open_bytes(&drv), 0);
    // A wrong tag.
    let (d, done) = started(&mut *one, &mut *two, &mut mem);
    let mut bad = good.clone();
    bad[0] ^= 1;
    mem.put(tag, &bad);
    assert_eq!(finish(&mut *one, &mut mem, d, done).status, status::EBADMSG);
    mem.put(tag, &good);
    assert_eq!(open_bytes(&drv), 0);
    // A fault in a later piece, then the request again from the start
    // (what the engine's retry after a stall does): counted once.
    let (d, done) = started(&mut *one, &mut *two, &mut mem);
    assert!(one.restartable(&d));
    mem.set_hole(Some((src + (1 << 20), src + (1 << 20) + 4096)));
    assert_eq!(finish(&mut *one, &mut mem, d, done).status, status::EFAULT);
    mem.set_hole(None);
    assert_eq!(open_bytes(&drv), 0);
    // A restart while the engine still had it under way.
    let _ = started(&mut *one, &mut *two, &mut mem);
    let mut again = op1;
    let Progress::More(done) = part(&mut *one, &mut mem, &mut again, 0) else {
        panic!("cut")
    };
    assert_eq!(open_bytes(&drv), n as u64, "counted once");
    let d = finish(&mut *one, &mut mem, again, done);
    assert_eq!(d.status, 0);
    assert!(mem.get(dst, n) == plain);
    assert_eq!(open_bytes(&drv), 0);
    // Its queue closed under way.
    let _ = started(&mut *one, &mut *two, &mut mem);
    drop(one);
    assert_eq!(open_bytes(&drv), 0);
    let d = finish(&mut *two, &mut mem, op2, 0);
    assert_eq!(d.status, 0);
    // A refused one left its session's message as it was: a stream under
    // way goes on.
    let mut one = drv.open_queue(TYPE_CIPHER);
    let s1 = new_session(&mut *one, &mut mem, &key);
    let op1 = gcm_message(s1, 0, (src, dst, n), (aad, 9), (tag, 16));
    fresh(&mut mem);
    let mut d = op1;
    assert!(matches!(
        part(&mut *one, &mut mem, &mut d, 0),
        Progress::More(_)
    ));
    let out = BASE + 0x70_0000;
    let head = cipher(s2, F_ENCRYPT | F_IV, src, out, 32, &[9; 12]);
    let mut h = head.encode();
    two.process(&mut h, &mut mem);
    assert_eq!(h.status, 0);
    refused(&mut *two, &mut mem);
    let mut tail = cipher(s2, F_ENCRYPT, src + 32, out + 32, 32, &[]);
    tail.flags |= F_FINAL;
    tail.tag = tag + 64;
    tail.tag_len = 16;
    let mut t = tail.encode();
    two.process(&mut t, &mut mem);
    assert_eq!(t.status, 0, "the stream went on");
    let mut want_tag = vec![0u8; 16];
    let want = openssl::symm::encrypt_aead(
        Cipher::aes_128_gcm(),
        &key,
        Some(&[9u8; 12]),
        b"",
        &ct[..64],
        &mut want_tag,
    )
    .unwrap();
    assert_eq!(mem.get(out, 64), want);
    assert_eq!(mem.get(tag + 64, 16), want_tag);
    drop(one);
    assert_eq!(open_bytes(&drv), 0);
}
