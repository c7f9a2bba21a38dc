//! The sec device at its edges, against OpenSSL: bursts of the
//! multi-buffer engine with long requests and overlapping outputs,
//! requests refused or faulting at a message's start, XTS's data-unit
//! limit, ECB without an IV.

mod common;

use common::{cipher, mem, openssl_crypt, run, session, BASE};
use openssl::symm::Cipher;
use wd_device::{status, DeviceQueue};
use wd_sec::msg::{DigestOp, F_DIGEST_FINAL, F_ENCRYPT, F_INIT, F_IV};
use wd_sec::{Alg, Hash, SecQueue, TYPE_CIPHER, TYPE_DIGEST};

/// XTS with equal key halves: OpenSSL refuses it for encryption but
/// allows decryption. After an encryption is refused, decryptions of the
/// session (which worked before) must keep working.
#[test]
fn a_refused_xts_encryption_keeps_decryption_working() {
    let alg = Alg::by_name("aes-128-xts").unwrap();
    let key = [0x11u8; 32];
    let tweak = [0x22u8; 16];
    let data: Vec<u8> = (0..64u8).collect();
    for direct in [true, false] {
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, &key);
        let (src, dst) = (BASE + 0x1000, BASE + 0x2000);
        mem.put(src, &data);
        let want = openssl_crypt(Cipher::aes_128_xts(), &key, Some(&tweak), &data, false);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_IV, src, dst, 64, &tweak).encode(),
        );
        assert_eq!(d.status, 0, "a decryption with equal halves");
        assert_eq!(mem.get(dst, 64), want);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, src, dst, 64, &tweak).encode(),
        );
        assert_eq!(d.status, status::EINVAL, "an encryption with equal halves");
        mem.put(dst, &[0; 64]);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_IV, src, dst, 64, &tweak).encode(),
        );
        assert_eq!(
            d.status, 0,
            "direct {direct}: the same decryption again after the refused encryption"
        );
        assert_eq!(mem.get(dst, 64), want);
    }
}

/// A request that faults before taking any data leaves its session as it
/// was (docs/sec-device.md, Sessions): one that starts a new message
/// (F_IV) but whose data is not shared must not end the message under
/// way, whose next part then continues it. The multi-buffer queue does
/// this; the libcrypto queue re-keys the context with the faulting
/// request's IV first, so the next part comes out from the wrong chain
/// with status 0.
#[test]
fn a_faulting_f_iv_request_leaves_the_message_under_way() {
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let (key, iv, bad_iv) = ([1u8; 16], [2u8; 16], [3u8; 16]);
    let data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
    let want = openssl_crypt(Cipher::aes_128_cbc(), &key, Some(&iv), &data, true);
    for direct in [true, false] {
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, &key);
        let (src, dst) = (BASE + 0x1000, BASE + 0x2000);
        let outside = BASE + 0x20000;
        mem.put(src, &data);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, src, dst, 32, &iv).encode(),
        );
        assert_eq!(d.status, 0);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT | F_IV, outside, dst + 0x100, 32, &bad_iv).encode(),
        );
        assert_eq!(d.status, status::EFAULT);
        let d = run(
            &mut q,
            &mut mem,
            cipher(s, F_ENCRYPT, src + 32, dst + 32, 32, &[]).encode(),
        );
        assert_eq!(d.status, 0);
        assert_eq!(
            mem.get(dst, 64),
            want,
            "direct {direct}: the message went on from the faulting request's IV"
        );
    }
}

/// The same for a digest: a request with F_INIT whose data faults restarts
/// the session's hash before the fault, and the message under way is lost
/// with status 0 for its next parts.
#[test]
fn a_faulting_f_init_digest_leaves_the_message_under_way() {
    let data: Vec<u8> = (0..200u8).collect();
    for direct in [true, false] {
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::new(TYPE_DIGEST);
        let s = session(&mut q, &mut mem, Alg::Digest(Hash::Sha256), &[]);
        let (src, out) = (BASE + 0x1000, BASE + 0x3000);
        let outside = BASE + 0x20000;
        mem.put(src, &data);
        let op = |flags, src, len: usize| {
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
        assert_eq!(run(&mut q, &mut mem, op(F_INIT, src, 100)).status, 0);
        assert_eq!(
            run(&mut q, &mut mem, op(F_INIT, outside, 100)).status,
            status::EFAULT
        );
        let d = run(&mut q, &mut mem, op(F_DIGEST_FINAL, src + 100, 100));
        assert_eq!(d.status, 0);
        assert_eq!(
            mem.get(out, 32),
            openssl::sha::sha256(&data).to_vec(),
            "direct {direct}"
        );
    }
}

/// Run a batch as the engine does (start each, then poll until every held
/// request is reported); the completed descriptors in batch order.
fn run_batch(
    q: &mut SecQueue,
    mem: &mut common::Mem,
    batch: &[wd_ring::Desc],
) -> Vec<wd_ring::Desc> {
    use wd_device::Started;
    let mut out: Vec<Option<wd_ring::Desc>> = vec![None; batch.len()];
    let mut done = Vec::new();
    let t0 = std::time::Instant::now();
    q.batch(batch.len());
    let mut i = 0;
    while i < batch.len() {
        let mut d = batch[i];
        match q.start(i as u64, &mut d, mem) {
            Started::Done => out[i] = Some(d),
            Started::Held => {}
            Started::Cut => out[i] = Some(common::run_in_pieces(q, mem, d, 256 << 10).0),
            Started::Later => {
                q.poll(&mut done);
                assert!(t0.elapsed().as_secs() < 5);
                continue;
            }
        }
        i += 1;
    }
    while q.in_flight() > 0 {
        q.poll(&mut done);
        assert!(t0.elapsed().as_secs() < 5);
    }
    for (t, d) in done {
        out[t as usize] = Some(d);
    }
    out.into_iter().map(|d| d.unwrap()).collect()
}

/// On a queue with the multi-buffer engine, where a CBC encryption that
/// ran in a burst continues is read back from the client's destination
/// memory after the whole burst: another request of the same burst (of
/// another session) writing over that block makes the session go on from
/// the other's ciphertext. The libcrypto queue keeps the chain in the
/// context and gets it right whatever the outputs do.
#[test]
fn a_bursts_chain_is_not_taken_from_memory_another_request_writes() {
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(
            "a_bursts_chain_is_not_taken_from_memory_another_request_writes",
            "no intel-ipsec-mb",
        );
        return;
    };
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let (ka, kb, iva, ivb) = ([1u8; 16], [2u8; 16], [3u8; 16], [4u8; 16]);
    let a: Vec<u8> = (0..64u8).collect();
    let b: Vec<u8> = (0..64u8).map(|x| x ^ 0x5a).collect();
    let want = openssl_crypt(Cipher::aes_128_cbc(), &ka, Some(&iva), &a, true);
    for mb in [None, Some(e)] {
        let mut mem = mem(0x10000, true);
        let mut q = SecQueue::with_engine(TYPE_CIPHER, mb);
        let sa = session(&mut q, &mut mem, alg, &ka);
        let sb = session(&mut q, &mut mem, alg, &kb);
        let (srca, srcb, scratch, dsta) =
            (BASE + 0x1000, BASE + 0x2000, BASE + 0x3000, BASE + 0x4000);
        mem.put(srca, &a);
        mem.put(srcb, &b);
        // Both first parts into one scratch buffer (their outputs are not
        // wanted): a's 32 bytes at its start, b's 64 bytes ending there.
        let first = [
            cipher(sa, F_ENCRYPT | F_IV, srca, scratch + 32, 32, &iva).encode(),
            cipher(sb, F_ENCRYPT | F_IV, srcb, scratch, 64, &ivb).encode(),
        ];
        for d in run_batch(&mut q, &mut mem, &first) {
            assert_eq!(d.status, 0);
        }
        let d = run_batch(
            &mut q,
            &mut mem,
            &[cipher(sa, F_ENCRYPT, srca + 32, dsta, 32, &[]).encode()],
        );
        assert_eq!(d[0].status, 0);
        assert_eq!(
            mem.get(dsta, 32),
            want[32..].to_vec(),
            "multi-buffer {}: a's second part",
            mb.is_some()
        );
    }
}

/// An XTS data unit longer than 2^20 blocks (16 MiB) is refused by OpenSSL
/// (IEEE 1619-2018): the request is malformed, known before any work, yet
/// the device runs it into libcrypto, reports -EIO (an engine error) and
/// ends the session's message.
#[test]
fn an_xts_data_unit_over_16_mib_is_a_bad_request() {
    let alg = Alg::by_name("aes-128-xts").unwrap();
    let key: Vec<u8> = (0..32u8).collect();
    let len = (16 << 20) + 16;
    let mut mem = mem(len + 0x10000, true);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(&mut q, &mut mem, alg, &key);
    let d = run(
        &mut q,
        &mut mem,
        cipher(
            s,
            F_ENCRYPT | F_IV,
            BASE + 0x10000,
            BASE + 0x10000,
            len,
            &[5; 16],
        )
        .encode(),
    );
    assert_eq!(d.status, status::EMSGSIZE, "a data unit over the XTS limit");
}

/// Random mixes on a multi-buffer queue: streams of CBC (both ways), CTR
/// and ECB, whose parts are short, cut (64 KiB..1 MiB, memory not held) or
/// long (> 1 MiB, held), in random batches, against OpenSSL.
#[test]
fn mixed_sizes_on_a_multi_buffer_queue_match_openssl() {
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(
            "mixed_sizes_on_a_multi_buffer_queue_match_openssl",
            "no intel-ipsec-mb",
        );
        return;
    };
    let mut rng: u64 = 0x9e3779b97f4a7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let rounds: usize = std::env::var("WD_TEST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    for round in 0..rounds {
        let mut mem = mem(24 << 20, true);
        let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
        let algs = [
            ("aes-128-cbc", true),
            ("aes-256-cbc", true),
            ("aes-128-cbc", false),
            ("aes-128-ctr", true),
            ("aes-192-ecb", true),
            ("aes-256-cbc", true),
        ];
        struct St {
            alg: Alg,
            enc: bool,
            key: Vec<u8>,
            iv: [u8; 16],
            parts: Vec<(u64, u64, usize)>,
            plain: Vec<u8>,
            next: usize,
            s: u64,
        }
        let mut all = Vec::new();
        let mut at = BASE + 0x10000;
        for (k, &(name, enc)) in algs.iter().enumerate() {
            let alg = Alg::by_name(name).unwrap();
            let key: Vec<u8> = (0..alg.key_len()).map(|_| next() as u8).collect();
            let mut iv = [0u8; 16];
            for b in iv.iter_mut() {
                *b = next() as u8;
            }
            let nparts = 1 + (next() % 4) as usize;
            let mut parts = Vec::new();
            let mut plain = Vec::new();
            for _ in 0..nparts {
                let n = match next() % 6 {
                    0 => (1 << 20) + 16 * (1 + (next() % 4096) as usize),
                    1 | 2 => (64 << 10) + 16 * (1 + (next() % 8000) as usize),
                    _ => 16 * (1 + (next() % 64) as usize),
                };
                let n = n.min(2 << 20);
                let data: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                mem.put(at, &data);
                let dst = if next() % 2 == 0 { at } else { at + n as u64 };
                parts.push((at, dst, n));
                plain.extend_from_slice(&data);
                at += 2 * n as u64 + 4096;
            }
            let s = session(&mut q, &mut mem, alg, &key);
            all.push(St {
                alg,
                enc,
                key,
                iv,
                parts,
                plain,
                next: 0,
                s,
            });
            let _ = k;
        }
        assert!(at < BASE + (24 << 20), "memory");
        while all.iter().any(|s| s.next < s.parts.len()) {
            let want = 1 + (next() % 6) as usize;
            let holds = next() % 3 != 0;
            mem.set_holds(holds);
            mem.set_slices(holds || next() % 2 == 0);
            let mut batch = Vec::new();
            let mut tries = 0;
            while batch.len() < want && all.iter().any(|s| s.next < s.parts.len()) && tries < 50 {
                tries += 1;
                let k = (next() % all.len() as u64) as usize;
                let st = &mut all[k];
                if st.next == st.parts.len() {
                    continue;
                }
                let (src, dst, n) = st.parts[st.next];
                let mut flags = if st.enc { F_ENCRYPT } else { 0 };
                let iv: &[u8] = if st.alg.iv_len() == 0 { &[] } else { &st.iv };
                if st.next == 0 {
                    flags |= F_IV;
                }
                batch.push(
                    cipher(
                        st.s,
                        flags,
                        src,
                        dst,
                        n,
                        if st.next == 0 { iv } else { &[] },
                    )
                    .encode(),
                );
                st.next += 1;
            }
            let outs = run_batch(&mut q, &mut mem, &batch);
            for (i, d) in outs.iter().enumerate() {
                if d.status != 0 {
                    for (j, b) in batch.iter().enumerate() {
                        eprintln!(
                            "{j}: {:?} -> {}",
                            wd_sec::msg::decode(b).unwrap(),
                            outs[j].status
                        );
                    }
                    eprintln!(
                        "holds {holds}, sessions: {:?}",
                        all.iter()
                            .map(|s| (s.s, s.alg.name(), s.enc))
                            .collect::<Vec<_>>()
                    );
                }
                assert_eq!(d.status, 0, "round {round} request {i}");
            }
        }
        for st in &all {
            let got: Vec<u8> = st
                .parts
                .iter()
                .flat_map(|&(_, dst, n)| mem.get(dst, n))
                .collect();
            let c = match st.alg.name().as_str() {
                "aes-128-cbc" => Cipher::aes_128_cbc(),
                "aes-256-cbc" => Cipher::aes_256_cbc(),
                "aes-128-ctr" => Cipher::aes_128_ctr(),
                "aes-192-ecb" => Cipher::aes_192_ecb(),
                n => panic!("{n}"),
            };
            let iv = (st.alg.iv_len() != 0).then_some(&st.iv[..]);
            assert!(
                got == openssl_crypt(c, &st.key, iv, &st.plain, st.enc),
                "round {round}: {} enc {}",
                st.alg.name(),
                st.enc
            );
        }
    }
}

/// intel-ipsec-mb's CBC burst refuses messages of 64 KiB or more
/// ("Invalid cipher message length"), yet the device gathers CBC
/// encryptions up to 1 MiB (`MB_MAX`). Two 64 KiB encryptions in one batch
/// (the crypto library's staging slot is 64 KiB) fail with -EIO, and so
/// does every other CBC encryption of the burst, short ones of other
/// sessions included; each of their messages is lost.
#[test]
fn a_burst_with_requests_of_64_kib_and_more_matches_openssl() {
    let Ok(e) = wd_ipsecmb::Engine::get() else {
        wd_testutil::skip(
            "a_burst_with_requests_of_64_kib_and_more_matches_openssl",
            "no intel-ipsec-mb",
        );
        return;
    };
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let keys = [[1u8; 16], [2u8; 16], [3u8; 16]];
    let iv = [9u8; 16];
    let lens = [64 << 10, 64 << 10, 4096];
    let mut mem = mem(1 << 20, true);
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut batch = Vec::new();
    let mut at = BASE + 0x1_0000;
    let mut placed = Vec::new();
    for (k, &n) in keys.iter().zip(&lens) {
        let s = session(&mut q, &mut mem, alg, k);
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + k[0] as usize) as u8).collect();
        mem.put(at, &data);
        batch.push(cipher(s, F_ENCRYPT | F_IV, at, at, n, &iv).encode());
        placed.push((at, data));
        at += n as u64 + 4096;
    }
    let out = run_batch(&mut q, &mut mem, &batch);
    let statuses: Vec<i32> = out.iter().map(|d| d.status).collect();
    assert_eq!(
        statuses,
        vec![0, 0, 0],
        "64 KiB, 64 KiB and 4 KiB CBC encryptions in one batch"
    );
    for ((at, data), k) in placed.iter().zip(&keys) {
        assert!(
            mem.get(*at, data.len())
                == openssl_crypt(Cipher::aes_128_cbc(), k, Some(&iv), data, true)
        );
    }
}

/// ECB has no chain: the device treats an ECB session as always having a
/// message under way (`started` is set at creation and kept when a message
/// is lost), yet its first request without F_IV is refused (-EINVAL)
/// because the context was never keyed.
#[test]
fn ecb_without_f_iv_on_a_fresh_session() {
    let alg = Alg::by_name("aes-128-ecb").unwrap();
    let key = [7u8; 16];
    let data: Vec<u8> = (0..64u8).collect();
    let mut mem = mem(0x10000, true);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(&mut q, &mut mem, alg, &key);
    mem.put(BASE + 0x1000, &data);
    let d = run(
        &mut q,
        &mut mem,
        cipher(s, F_ENCRYPT, BASE + 0x1000, BASE + 0x2000, 64, &[]).encode(),
    );
    assert_eq!(
        d.status, 0,
        "ECB encryption without F_IV on a fresh session"
    );
    assert_eq!(
        mem.get(BASE + 0x2000, 64),
        openssl_crypt(Cipher::aes_128_ecb(), &key, None, &data, true)
    );
}
