//! The sec device where a request faults, or runs another way than usual:
//! through the bounce path, on a multi-buffer queue, cut in pieces. A
//! failed request must leave its session where it was, or lose the
//! message it was part of, and never let a later request give a wrong
//! result with status 0.

mod common;

use common::{cipher, mem, openssl_crypt, run, run_in_pieces, session, Mem, BASE};
use openssl::symm::Cipher;
use wd_device::{status, DeviceQueue, Progress};
use wd_ring::Desc;
use wd_sec::msg::{CipherOp, DigestOp, F_DIGEST_FINAL, F_ENCRYPT, F_FINAL, F_INIT, F_IV};
use wd_sec::{Alg, Hash, SecQueue, TYPE_CIPHER, TYPE_DIGEST};

fn encrypted(c: Cipher, key: &[u8], iv: Option<&[u8]>, data: &[u8]) -> Vec<u8> {
    openssl_crypt(c, key, iv, data, true)
}

/// XTS through the bounce path (memory not contiguous in the host: SHARE_ALL,
/// legacy, a range split over two shares) is fed to libcrypto 256 KiB at a
/// time; every XTS update is a data unit of its own starting from the
/// tweak, so bytes past 256 KiB come out wrong (status 0).
#[test]
fn xts_over_256k_through_bounce_matches_openssl() {
    let alg = Alg::by_name("aes-128-xts").unwrap();
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    let iv = [3u8; 16];
    let len = 512 << 10;
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let want = encrypted(Cipher::aes_128_xts(), &key, Some(&iv), &data);
    for direct in [true, false] {
        let mut mem = mem(2 << 20, direct);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, &key);
        let (src, dst) = (BASE + 0x1_0000, BASE + 0x10_0000);
        mem.put(src, &data);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, src, dst, len, &iv).encode(),
        );
        assert_eq!(d.status, 0, "direct {direct}");
        let got = mem.get(dst, len);
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first, None,
            "direct {direct}: XTS ciphertext differs from byte {first:?}"
        );
    }
}

/// On a queue with the multi-buffer engine, a CBC continuation whose output
/// faults drops the session's chain (`cbc_alone` clears it before running):
/// the retry of the same request is refused, where the libcrypto-only
/// queue keeps the chain (test `a_request_that_faults_changes_nothing`).
#[test]
fn mb_queue_cbc_fault_keeps_the_chain() {
    const TEST: &str = "mb_queue_cbc_fault_keeps_the_chain";
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(TEST, "no intel-ipsec-mb");
        return;
    };
    let outside = BASE + 0x10000 - 16;
    for direct in [true, false] {
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
        let alg = Alg::by_name("aes-128-cbc").unwrap();
        let (key, iv) = ([7u8; 16], [9u8; 16]);
        let s = session(&mut q, &mut mem, alg, &key);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        mem.put(BASE, &data);
        let (src, dst) = (BASE, BASE + 0x2000);
        // One request per pass: the engine runs them at once (start).
        let go = |q: &mut SecQueue, mem: &mut Mem, op: CipherOp| {
            q.batch(1);
            let mut d = op.encode();
            let st = q.start(0, &mut d, mem);
            assert_eq!(st, wd_device::Started::Done);
            d
        };
        let first = go(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, src, dst, 2048, &iv),
        );
        assert_eq!(first.status, 0);
        let bad = go(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT, src + 2048, outside, 2048, &[]),
        );
        assert_eq!(bad.status, status::EFAULT);
        let again = go(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT, src + 2048, dst + 2048, 2048, &[]),
        );
        assert_eq!(
            again.status, 0,
            "direct {direct}: the retried part is refused"
        );
        assert!(mem.get(dst, 4096) == encrypted(Cipher::aes_128_cbc(), &key, Some(&iv), &data));
    }
}

/// The GCM message of the fault tests (AES-128): key, nonce, 16 bytes of
/// additional data, 64 bytes of data, and OpenSSL's ciphertext and tag.
struct Gcm {
    key: [u8; 16],
    nonce: [u8; 12],
    aad: [u8; 16],
    data: Vec<u8>,
    ct: Vec<u8>,
    tag: [u8; 16],
}

fn gcm_message() -> Gcm {
    let (key, nonce, aad) = ([0x11u8; 16], [0x22u8; 12], [0x33u8; 16]);
    let data: Vec<u8> = (0..64u8).collect();
    let mut tag = [0u8; 16];
    let ct = openssl::symm::encrypt_aead(
        Cipher::aes_128_gcm(),
        &key,
        Some(&nonce),
        &aad,
        &data,
        &mut tag,
    )
    .unwrap();
    Gcm {
        key,
        nonce,
        aad,
        data,
        ct,
        tag,
    }
}

/// GCM: additional data of a request that continues a message (no F_IV)
/// is taken into the GHASH before the data's memory is checked; a fault
/// on the data then leaves the AAD absorbed, and the retry absorbs it again:
/// the tag comes out wrong with status 0.
#[test]
fn gcm_aad_of_a_faulting_continuation_is_not_taken_twice() {
    let alg = Alg::by_name("aes-128-gcm").unwrap();
    let Gcm {
        key,
        nonce,
        aad,
        data,
        ct: want_ct,
        tag: want_tag,
    } = gcm_message();
    // Without the fault first the same requests give OpenSSL's tag; with
    // it, through both memory paths, too.
    for (direct, fault) in [(true, false), (true, true), (false, true)] {
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, &key);
        let (src, dst, aad_at, tag_at) = (BASE, BASE + 0x1000, BASE + 0x2000, BASE + 0x3000);
        let outside = BASE + 0x10000 - 16;
        mem.put(src, &data);
        mem.put(aad_at, &aad);
        // Start the message: the nonce, nothing else.
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, src, dst, 0, &nonce).encode(),
        );
        assert_eq!(d.status, 0);
        let fin = |dst: u64| {
            let mut c = cipher(s, F_ENCRYPT | F_FINAL, src, dst, 64, &[]);
            (c.aad, c.aad_len, c.tag, c.tag_len) = (aad_at, 16, tag_at, 16);
            c.encode()
        };
        if fault {
            assert_eq!(run(&mut q, &mut mem, fin(outside)).status, status::EFAULT);
        }
        let d = run(&mut q, &mut mem, fin(dst));
        assert_eq!(d.status, 0);
        assert_eq!(mem.get(dst, 64), want_ct);
        assert_eq!(
            mem.get(tag_at, 16),
            want_tag.to_vec(),
            "direct {direct}, fault {fault}: wrong tag"
        );
    }
}

/// A request cut in pieces (sync queue, `process_part`) whose later piece
/// faults (the client unshared part of its buffer between passes) completes
/// with -EFAULT with the earlier pieces already taken into the session.
/// Sent again, it used to be hashed on top of its own first piece (a
/// wrong digest with status 0); now the message is lost and only a new
/// one is taken.
#[test]
fn cut_digest_faulting_in_a_later_piece_then_retried() {
    let len = 300 << 10;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
    let head = vec![9u8; 4096];
    let mut mem = mem(0x80000, true);
    let mut q = SecQueue::new(TYPE_DIGEST);
    let s = session(&mut q, &mut mem, Alg::Digest(Hash::Sha256), &[]);
    let (src, hsrc, out) = (BASE + 0x1_0000, BASE + 0x1000, BASE + 0x6000);
    mem.put(src, &data);
    mem.put(hsrc, &head);
    let part = |flags, src, len: usize| {
        DigestOp {
            session: s,
            alg: None,
            flags,
            src,
            len: len as u64,
            out,
        }
        .encode()
    };
    assert_eq!(run(&mut q, &mut mem, part(F_INIT, hsrc, 4096)).status, 0);
    // The long final part, in pieces: the first runs, then the client
    // unshares the tail and the second faults.
    let orig = part(F_DIGEST_FINAL, src, len);
    let mut d = orig;
    let p = q.process_part(&mut d, &mut mem, 0, 1);
    let Progress::More(done) = p else {
        panic!("not cut: {p:?}")
    };
    mem.set_hole(Some((src + done, src + len as u64)));
    let mut d = orig;
    assert_eq!(q.process_part(&mut d, &mut mem, done, 1), Progress::Done);
    assert_eq!(d.status, status::EFAULT);
    // Shared again and sent again: the message is lost, the request is
    // refused rather than hashed on top of its own first piece.
    mem.set_hole(None);
    let mut d = orig;
    assert_eq!(q.process_part(&mut d, &mut mem, 0, 1), Progress::Done);
    assert_eq!(d.status, status::EINVAL, "a lost message went on");
    // The whole message again, from its start.
    assert_eq!(run(&mut q, &mut mem, part(F_INIT, hsrc, 4096)).status, 0);
    let (d, _) = run_in_pieces(&mut q, &mut mem, orig, 1);
    assert_eq!(d.status, 0);
    let mut all = head.clone();
    all.extend_from_slice(&data);
    assert_eq!(mem.get(out, 32), openssl::sha::sha256(&all).to_vec());
}

/// The same for a CBC continuation cut in pieces.
#[test]
fn cut_cbc_continuation_faulting_in_a_later_piece_then_retried() {
    let len = 256 << 10;
    let data: Vec<u8> = (0..4096 + len).map(|i| (i * 13 % 251) as u8).collect();
    let mut mem = mem(0x100000, true);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let (key, iv) = ([1u8; 16], [2u8; 16]);
    let s = session(&mut q, &mut mem, alg, &key);
    let (src, dst) = (BASE + 0x1_0000, BASE + 0x8_0000);
    mem.put(src, &data);
    let d = run(
        &mut q,
        &mut mem,
        cipher(s, F_ENCRYPT | F_IV, src, dst, 4096, &iv).encode(),
    );
    assert_eq!(d.status, 0);
    let orig = cipher(s, F_ENCRYPT, src + 4096, dst + 4096, len, &[]).encode();
    let mut d = orig;
    let Progress::More(done) = q.process_part(&mut d, &mut mem, 0, 1) else {
        panic!("not cut")
    };
    mem.set_hole(Some((dst + 4096 + done, dst + 4096 + len as u64)));
    let mut d = orig;
    assert_eq!(q.process_part(&mut d, &mut mem, done, 1), Progress::Done);
    assert_eq!(d.status, status::EFAULT);
    mem.set_hole(None);
    let mut d = orig;
    assert_eq!(q.process_part(&mut d, &mut mem, 0, 1), Progress::Done);
    assert_eq!(d.status, status::EINVAL, "a lost message went on");
    let d = run(
        &mut q,
        &mut mem,
        cipher(s, F_ENCRYPT | F_IV, src, dst, 4096, &iv).encode(),
    );
    assert_eq!(d.status, 0);
    let (d, _) = run_in_pieces(&mut q, &mut mem, orig, 1);
    assert_eq!(d.status, 0);
    assert!(mem.get(dst, 4096 + len) == encrypted(Cipher::aes_128_cbc(), &key, Some(&iv), &data));
}

/// After a CBC encryption that ran in a multi-buffer burst, a decryption
/// without F_IV "continues" the decryption that ran on the session before
/// the encryption (the burst never touched the context's message flags);
/// the libcrypto queue refuses it (-EINVAL), as it should.
#[test]
fn mb_burst_encrypt_ends_an_earlier_decrypt_stream() {
    const TEST: &str = "mb_burst_encrypt_ends_an_earlier_decrypt_stream";
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(TEST, "no intel-ipsec-mb");
        return;
    };
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let iv = [4u8; 16];
    for mb in [false, true] {
        let mut mem = mem(0x10000, true);
        let mut q = SecQueue::with_engine(TYPE_CIPHER, mb.then_some(e));
        let s = session(&mut q, &mut mem, alg, &[1u8; 16]);
        let t = session(&mut q, &mut mem, alg, &[2u8; 16]);
        let (a, b, c) = (BASE + 0x1000, BASE + 0x2000, BASE + 0x3000);
        let all = |q: &mut SecQueue, mem: &mut Mem, ops: &[CipherOp]| -> Vec<Desc> {
            if !q.asynchronous() {
                return ops.iter().map(|op| run(q, mem, op.encode())).collect();
            }
            q.batch(ops.len());
            let mut out = vec![None; ops.len()];
            for (i, op) in ops.iter().enumerate() {
                let mut d = op.encode();
                if q.start(i as u64, &mut d, mem) == wd_device::Started::Done {
                    out[i] = Some(d);
                }
            }
            let mut done = Vec::new();
            let t0 = std::time::Instant::now();
            while q.in_flight() > 0 {
                q.poll(&mut done);
                assert!(t0.elapsed().as_secs() < 5, "never reported");
            }
            for (t, d) in done {
                out[t as usize] = Some(d);
            }
            out.into_iter().map(Option::unwrap).collect()
        };
        let r = all(&mut q, &mut mem, &[cipher(s, F_IV, a, b, 64, &iv)]);
        assert_eq!(r[0].status, 0);
        // Two encryptions in one pass: a burst on the multi-buffer queue.
        let r = all(
            &mut q,
            &mut mem,
            &[
                cipher(s, F_ENCRYPT | F_IV, a, b, 64, &iv),
                cipher(t, F_ENCRYPT | F_IV, a, c, 64, &iv),
            ],
        );
        assert_eq!((r[0].status, r[1].status), (0, 0));
        let r = all(&mut q, &mut mem, &[cipher(s, 0, a, b, 64, &[])]);
        assert_eq!(
            r[0].status,
            status::EINVAL,
            "mb {mb}: a decryption continued across an encryption"
        );
    }
}

/// On a SHARE_ALL queue memory is reached only as it is used (nothing to
/// check beforehand), so a fault can come after the context took part of
/// a request. A request that did not start its message then loses the
/// message (-EIO: no stall, whose retry would take again what was taken);
/// one that starts its message faults (-EFAULT) and runs again right.
/// Both failed with -EFAULT, and their retries completed with status 0: a
/// GCM tag with its additional data hashed twice, a digest of the final
/// request's data alone (the hash had started again before its output
/// faulted).
#[test]
fn share_all_faults_after_the_context_moved_lose_the_message() {
    let gcm = Alg::by_name("aes-128-gcm").unwrap();
    let Gcm {
        key,
        nonce,
        aad,
        data,
        ct: want_ct,
        tag: want_tag,
    } = gcm_message();
    let (src, dst, aad_at, tag_at) = (BASE + 0x1000, BASE + 0x2000, BASE + 0x3000, BASE + 0x4000);
    let fin = |s, flags, nonce: &[u8]| {
        let mut c = cipher(s, F_ENCRYPT | F_FINAL | flags, src, dst, 64, nonce);
        (c.aad, c.aad_len, c.tag, c.tag_len) = (aad_at, 16, tag_at, 16);
        c.encode()
    };
    let mut m = mem(0x10000, false);
    m.set_share_all(true);
    m.put(src, &data);
    m.put(aad_at, &aad);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(&mut q, &mut m, gcm, &key);
    // A continuation whose data, then one whose tag, faults.
    for hole in [(src, src + 64), (tag_at, tag_at + 16)] {
        let start = cipher(s, F_ENCRYPT | F_IV, src, dst, 0, &nonce).encode();
        assert_eq!(run(&mut q, &mut m, start).status, 0);
        m.set_hole(Some(hole));
        assert_eq!(
            run(&mut q, &mut m, fin(s, 0, &[])).status,
            status::EIO,
            "hole {hole:x?}"
        );
        m.set_hole(None);
        assert_eq!(
            run(&mut q, &mut m, fin(s, 0, &[])).status,
            status::EINVAL,
            "the message is lost"
        );
    }
    // A whole message whose tag faults runs again right.
    m.set_hole(Some((tag_at, tag_at + 16)));
    assert_eq!(
        run(&mut q, &mut m, fin(s, F_IV, &nonce)).status,
        status::EFAULT
    );
    m.set_hole(None);
    assert_eq!(run(&mut q, &mut m, fin(s, F_IV, &nonce)).status, 0);
    assert_eq!(
        (m.get(dst, 64), m.get(tag_at, 16)),
        (want_ct, want_tag.to_vec())
    );

    // A digest whose final request's output faults.
    let mut q = SecQueue::new(TYPE_DIGEST);
    let s = session(&mut q, &mut m, Alg::Digest(Hash::Sha256), &[]);
    let out = BASE + 0x6000;
    let op = |flags, src| {
        DigestOp {
            session: s,
            alg: None,
            flags,
            src,
            len: 64,
            out,
        }
        .encode()
    };
    assert_eq!(run(&mut q, &mut m, op(F_INIT, src)).status, 0);
    m.set_hole(Some((out, out + 32)));
    assert_eq!(
        run(&mut q, &mut m, op(F_DIGEST_FINAL, aad_at)).status,
        status::EIO
    );
    m.set_hole(None);
    assert_eq!(
        run(&mut q, &mut m, op(F_DIGEST_FINAL, aad_at)).status,
        status::EINVAL,
        "the message is lost"
    );
    // Whole in one request, it runs again right.
    m.set_hole(Some((out, out + 32)));
    assert_eq!(
        run(&mut q, &mut m, op(F_INIT | F_DIGEST_FINAL, src)).status,
        status::EFAULT
    );
    m.set_hole(None);
    assert_eq!(
        run(&mut q, &mut m, op(F_INIT | F_DIGEST_FINAL, src)).status,
        0
    );
    assert_eq!(m.get(out, 32), openssl::sha::sha256(&data).to_vec());
}

/// The same on the multi-buffer engine's CBC path, which uses the chain
/// up before it moves the data: a continuation faulting there lost its
/// message and said -EFAULT (a stall's retry was then refused); one that
/// starts its message runs again right.
#[test]
fn mb_share_all_cbc_fault_loses_a_continued_message() {
    const TEST: &str = "mb_share_all_cbc_fault_loses_a_continued_message";
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(TEST, "no intel-ipsec-mb");
        return;
    };
    let mut m = mem(0x10000, false);
    m.set_share_all(true);
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let (key, iv) = ([7u8; 16], [9u8; 16]);
    let s = session(&mut q, &mut m, Alg::by_name("aes-128-cbc").unwrap(), &key);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    let (src, dst) = (BASE, BASE + 0x2000);
    m.put(src, &data);
    let part = |flags, at: u64, iv: &[u8]| {
        cipher(s, F_ENCRYPT | flags, src + at, dst + at, 2048, iv).encode()
    };
    assert_eq!(run(&mut q, &mut m, part(F_IV, 0, &iv)).status, 0);
    m.set_hole(Some((dst + 2048, dst + 4096)));
    assert_eq!(run(&mut q, &mut m, part(0, 2048, &[])).status, status::EIO);
    assert_eq!(run(&mut q, &mut m, part(F_IV, 0, &iv)).status, 0);
    assert_eq!(
        run(&mut q, &mut m, part(F_IV, 2048, &iv)).status,
        status::EFAULT
    );
    m.set_hole(None);
    assert_eq!(run(&mut q, &mut m, part(F_IV, 2048, &iv)).status, 0);
    let want = encrypted(Cipher::aes_128_cbc(), &key, Some(&iv), &data[2048..]);
    assert!(m.get(dst + 2048, 2048) == want);
}
