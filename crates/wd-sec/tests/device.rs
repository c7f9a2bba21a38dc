//! The sec device against OpenSSL's default provider (the `openssl` crate)
//! on random keys, IVs, data and request splits, through both memory paths
//! (in place and bounce), plus published known answers and error cases.

mod common;

use common::{
    gcm_message, mb_engine, mem, openssl_crypt, queue_engines, run, run_in_pieces, session,
    set_direct, Mem, BASE,
};
use openssl::symm::Cipher;
use proptest::prelude::*;
use wd_device::{status, DeviceQueue, Progress, Started};
use wd_ring::Desc;
use wd_sec::msg::{
    self, CipherOp, DigestOp, SessionFree, SessionNew, F_DIGEST_FINAL, F_ENCRYPT, F_FINAL, F_INIT,
    F_IV,
};
use wd_sec::{Alg, Hash, Mode, SecQueue, TYPE_CIPHER, TYPE_DIGEST};

fn openssl_cipher(alg: Alg) -> Cipher {
    Cipher::from_nid(match alg.name().as_str() {
        "aes-128-ecb" => openssl::nid::Nid::AES_128_ECB,
        "aes-192-ecb" => openssl::nid::Nid::AES_192_ECB,
        "aes-256-ecb" => openssl::nid::Nid::AES_256_ECB,
        "aes-128-cbc" => openssl::nid::Nid::AES_128_CBC,
        "aes-192-cbc" => openssl::nid::Nid::AES_192_CBC,
        "aes-256-cbc" => openssl::nid::Nid::AES_256_CBC,
        "aes-128-ctr" => openssl::nid::Nid::AES_128_CTR,
        "aes-192-ctr" => openssl::nid::Nid::AES_192_CTR,
        "aes-256-ctr" => openssl::nid::Nid::AES_256_CTR,
        "aes-128-xts" => openssl::nid::Nid::AES_128_XTS,
        "aes-256-xts" => openssl::nid::Nid::AES_256_XTS,
        "aes-128-gcm" => openssl::nid::Nid::AES_128_GCM,
        "aes-256-gcm" => openssl::nid::Nid::AES_256_GCM,
        n => panic!("{n}"),
    })
    .unwrap()
}

/// Reference: the whole message through OpenSSL in one go.
fn reference(alg: Alg, key: &[u8], iv: &[u8], data: &[u8], encrypt: bool) -> Vec<u8> {
    let iv = (!iv.is_empty()).then_some(iv);
    openssl_crypt(openssl_cipher(alg), key, iv, data, encrypt)
}

fn cipher_op(session: u64, flags: u16, src: u64, dst: u64, len: usize, iv: &[u8]) -> Desc {
    common::cipher(session, flags, src, dst, len, iv).encode()
}

const STREAM_MODES: [&str; 9] = [
    "aes-128-ecb",
    "aes-192-ecb",
    "aes-256-ecb",
    "aes-128-cbc",
    "aes-192-cbc",
    "aes-256-cbc",
    "aes-128-ctr",
    "aes-192-ctr",
    "aes-256-ctr",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// ECB/CBC/CTR: a message split into chained requests (IV only on the
    /// first) equals OpenSSL's one-shot result, in both directions, in
    /// place or not, with or without zero copy.
    #[test]
    fn chained_stream_ciphers_match_openssl(
        which in 0usize..STREAM_MODES.len(),
        key in proptest::collection::vec(any::<u8>(), 32),
        iv in proptest::collection::vec(any::<u8>(), 16),
        blocks in proptest::collection::vec(0usize..40, 1..5),
        seed in any::<u64>(),
        in_place in any::<bool>(),
        direct in any::<bool>(),
        encrypt in any::<bool>(),
    ) {
        let alg = Alg::by_name(STREAM_MODES[which]).unwrap();
        let key = &key[..alg.key_len()];
        let iv = &iv[..alg.iv_len()];
        let ctr = matches!(alg, Alg::Aes { mode: Mode::Ctr, .. });
        // Request lengths: whole blocks, except CTR which takes any length.
        let lens: Vec<usize> = blocks.iter().enumerate()
            .map(|(i, b)| if ctr { b * 7 + (seed as usize >> i) % 5 } else { b * 16 })
            .collect();
        let total: usize = lens.iter().sum();
        let data: Vec<u8> = (0..total).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 13) as u8).collect();
        let mut mem = mem(0x10000 + 2 * total, direct);
        let src = BASE;
        let dst = if in_place { BASE } else { BASE + 0x10000 };
        mem.put(src, &data);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, key);
        let mut off = 0;
        for (i, &l) in lens.iter().enumerate() {
            let mut flags = if encrypt { F_ENCRYPT } else { 0 };
            if i == 0 && alg.iv_len() > 0 || i == 0 && !ctr && alg.iv_len() == 0 { flags |= F_IV; }
            let d = run(&mut q, &mut mem, cipher_op(s, flags, src + off as u64, dst + off as u64, l, if flags & F_IV != 0 { iv } else { &[] }));
            prop_assert_eq!(d.status, 0, "request {} of {}", i, alg.name());
            prop_assert_eq!(d.result, l as u64);
            off += l;
        }
        let want = reference(alg, key, iv, &data, encrypt);
        prop_assert_eq!(mem.get(dst, total), want);
    }

    /// GCM one-shot: the tag and ciphertext match OpenSSL; decryption with
    /// the right tag restores the plaintext, a flipped tag bit releases
    /// nothing and says EBADMSG.
    #[test]
    fn gcm_matches_openssl_and_checks_tags(
        big in any::<bool>(),
        key in proptest::collection::vec(any::<u8>(), 32),
        iv in proptest::collection::vec(any::<u8>(), 12),
        aad in proptest::collection::vec(any::<u8>(), 0..40),
        data in proptest::collection::vec(any::<u8>(), 0..300),
        direct in any::<bool>(),
        flip in 0usize..128,
    ) {
        let alg = Alg::by_name(if big { "aes-256-gcm" } else { "aes-128-gcm" }).unwrap();
        let key = &key[..alg.key_len()];
        let mut mem = mem(0x10000, direct);
        let (src, dst, aad_at, tag_at) = (BASE, BASE + 0x1000, BASE + 0x2000, BASE + 0x3000);
        mem.put(src, &data);
        mem.put(aad_at, &aad);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, key);
        let op = |flags: u16, src: u64, dst: u64| {
            let mut ivb = [0u8; 16];
            ivb[..12].copy_from_slice(&iv);
            CipherOp { session: s, flags, src, dst, len: data.len() as u64, iv: ivb, iv_len: 12,
                aad: aad_at, aad_len: aad.len() as u32, tag: tag_at, tag_len: 16 }.encode()
        };
        let d = run(&mut q, &mut mem, op(F_ENCRYPT | F_IV | F_FINAL, src, dst));
        prop_assert_eq!(d.status, 0);
        let mut want_tag = [0u8; 16];
        let want = openssl::symm::encrypt_aead(openssl_cipher(alg), key, Some(&iv), &aad, &data, &mut want_tag).unwrap();
        prop_assert_eq!(mem.get(dst, data.len()), want.clone());
        prop_assert_eq!(mem.get(tag_at, 16), want_tag.to_vec());
        // Decrypt back into a cleared area.
        let back = BASE + 0x4000;
        let d = run(&mut q, &mut mem, op(F_IV | F_FINAL, dst, back));
        prop_assert_eq!(d.status, 0);
        prop_assert_eq!(mem.get(back, data.len()), data.clone());
        // A corrupted tag: authentication failure, no plaintext released.
        let mut bad = want_tag;
        bad[flip / 8] ^= 1 << (flip % 8);
        mem.put(tag_at, &bad);
        let clean = BASE + 0x5000;
        let d = run(&mut q, &mut mem, op(F_IV | F_FINAL, dst, clean));
        prop_assert_eq!(d.status, -74);
        prop_assert!(mem.get(clean, data.len()).iter().all(|&b| b == 0));
    }

    /// Digests and HMAC fed in random pieces equal the one-shot reference.
    #[test]
    fn incremental_digests_match_openssl(
        which in 0usize..5,
        hmac in any::<bool>(),
        // (OpenSSL's reference refuses an empty HMAC key; wd-crypto's tests
        // check that case against a known answer.)
        key in proptest::collection::vec(any::<u8>(), 1..200),
        data in proptest::collection::vec(any::<u8>(), 0..2000),
        cuts in proptest::collection::vec(0usize..2000, 0..4),
        direct in any::<bool>(),
    ) {
        let h = [Hash::Sha1, Hash::Sha224, Hash::Sha256, Hash::Sha384, Hash::Sha512][which];
        let md = match h {
            Hash::Sha1 => openssl::hash::MessageDigest::sha1(),
            Hash::Sha224 => openssl::hash::MessageDigest::sha224(),
            Hash::Sha256 => openssl::hash::MessageDigest::sha256(),
            Hash::Sha384 => openssl::hash::MessageDigest::sha384(),
            Hash::Sha512 => openssl::hash::MessageDigest::sha512(),
        };
        let want = if hmac {
            let k = openssl::pkey::PKey::hmac(&key).unwrap();
            let mut s = openssl::sign::Signer::new(md, &k).unwrap();
            s.update(&data).unwrap();
            s.sign_to_vec().unwrap()
        } else {
            openssl::hash::hash(md, &data).unwrap().to_vec()
        };
        let mut mem = mem(0x10000, direct);
        mem.put(BASE, &data);
        let mut q = SecQueue::new(TYPE_DIGEST);
        let alg = if hmac { Alg::Hmac(h) } else { Alg::Digest(h) };
        let s = session(&mut q, &mut mem, alg, if hmac { &key } else { &[] });
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        points.push(0);
        points.push(data.len());
        points.sort();
        let out = BASE + 0x9000;
        for (i, w) in points.windows(2).enumerate() {
            let last = i + 2 == points.len();
            let mut flags = if i == 0 { F_INIT } else { 0 };
            if last { flags |= F_DIGEST_FINAL; }
            let d = run(&mut q, &mut mem, DigestOp { session: s, alg: None, flags, src: BASE + w[0] as u64, len: (w[1] - w[0]) as u64, out }.encode());
            prop_assert_eq!(d.status, 0);
            if last { prop_assert_eq!(d.result as usize, h.digest_len()); }
        }
        prop_assert_eq!(mem.get(out, h.digest_len()), want.clone());
        // The session restarted: the same data again gives the same digest.
        let d = run(&mut q, &mut mem, DigestOp { session: s, alg: None, flags: F_DIGEST_FINAL, src: BASE, len: data.len() as u64, out }.encode());
        prop_assert_eq!(d.status, 0);
        prop_assert_eq!(mem.get(out, h.digest_len()), want.clone());
        if !hmac {
            // Session-less one-shot.
            let d = run(&mut q, &mut mem, DigestOp { session: 0, alg: Some(Alg::Digest(h)), flags: F_INIT | F_DIGEST_FINAL, src: BASE, len: data.len() as u64, out }.encode());
            prop_assert_eq!(d.status, 0);
            prop_assert_eq!(mem.get(out, h.digest_len()), want);
        }
    }
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn xts_known_answer_ieee_1619_vector_4() {
    // IEEE P1619/D16 annex B, vector 4 (AES-128-XTS, data unit 512 bytes).
    let key = hex("2718281828459045235360287471352631415926535897932384626433832795");
    let pt: Vec<u8> = (0..512).map(|i| i as u8).collect();
    let want_start = hex("27a7479befa1d476489f308cd4cfa6e2a96e4bbe3208ff25287dd3819616e89c");
    let alg = Alg::by_name("aes-128-xts").unwrap();
    for direct in [true, false] {
        let mut mem = mem(0x10000, direct);
        mem.put(BASE, &pt);
        let mut q = SecQueue::new(TYPE_CIPHER);
        let s = session(&mut q, &mut mem, alg, &key);
        let d = run(
            &mut q,
            &mut mem,
            cipher_op(s, F_ENCRYPT | F_IV, BASE, BASE + 0x1000, 512, &[0; 16]),
        );
        assert_eq!(d.status, 0);
        assert_eq!(mem.get(BASE + 0x1000, 32), want_start);
        assert_eq!(
            mem.get(BASE + 0x1000, 512),
            reference(alg, &key, &[0; 16], &pt, true)
        );
        // XTS has no chaining: each request is one data unit with its tweak.
        let d = run(
            &mut q,
            &mut mem,
            cipher_op(s, F_ENCRYPT, BASE, BASE + 0x1000, 512, &[]),
        );
        assert_eq!(d.status, -22);
    }
}

#[test]
fn gcm_known_answer_test_case_4() {
    // GCM spec (McGrew & Viega) test case 4: AES-128, 60-byte plaintext,
    // 20-byte AAD.
    let key = hex("feffe9928665731c6d6a8f9467308308");
    let iv = hex("cafebabefacedbaddecaf888");
    let pt = hex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72
         1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
    );
    let aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    let ct = hex(
        "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e
         21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
    );
    let tag = hex("5bc94fbc3221a5db94fae95ae7121a47");
    let alg = Alg::by_name("aes-128-gcm").unwrap();
    let mut mem = mem(0x10000, true);
    mem.put(BASE, &pt);
    mem.put(BASE + 0x2000, &aad);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(&mut q, &mut mem, alg, &key);
    let mut ivb = [0u8; 16];
    ivb[..12].copy_from_slice(&iv);
    // Streaming: AAD + data, then a final request with no data.
    let first = CipherOp {
        session: s,
        flags: F_ENCRYPT | F_IV,
        src: BASE,
        dst: BASE + 0x1000,
        len: 60,
        iv: ivb,
        iv_len: 12,
        aad: BASE + 0x2000,
        aad_len: 20,
        tag: 0,
        tag_len: 0,
    };
    assert_eq!(run(&mut q, &mut mem, first.encode()).status, 0);
    let fin = CipherOp {
        flags: F_ENCRYPT | F_FINAL,
        len: 0,
        iv: [0; 16],
        iv_len: 0,
        aad: 0,
        aad_len: 0,
        tag: BASE + 0x3000,
        tag_len: 16,
        ..first
    };
    assert_eq!(run(&mut q, &mut mem, fin.encode()).status, 0);
    assert_eq!(mem.get(BASE + 0x1000, 60), ct);
    assert_eq!(mem.get(BASE + 0x3000, 16), tag);
}

/// The driver's `sessions` attribute counts sessions alive on all of its
/// queues: freed ones and those of a dropped queue (a client gone) leave
/// it, so a leak shows.
#[test]
fn the_driver_counts_live_sessions_across_queues() {
    use wd_device::Driver;
    let drv = wd_sec::SecDriver::new(wd_sec::EngineChoice::Libcrypto).unwrap();
    let live = || {
        let a = drv.attributes();
        a.iter().find(|a| a.0 == "sessions").unwrap().1.clone()
    };
    let mut mem = mem(0x10000, true);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let key_addr = BASE + 0x8000;
    mem.put(key_addr, &[1; 16]);
    let open = |q: &mut Box<dyn DeviceQueue>, mem: &mut Mem| {
        let mut d = SessionNew::new(alg, &[1; 16], key_addr).encode();
        q.process(&mut d, mem);
        assert_eq!(d.status, 0);
        d.result
    };
    let mut a = drv.open_queue(TYPE_CIPHER);
    let mut b = drv.open_queue(TYPE_CIPHER);
    let s = open(&mut a, &mut mem);
    open(&mut a, &mut mem);
    open(&mut b, &mut mem);
    assert_eq!(live(), "3");
    let mut d = SessionFree { session: s }.encode();
    a.process(&mut d, &mut mem);
    assert_eq!((d.status, live()), (0, "2".to_string()));
    drop(b);
    assert_eq!(live(), "1");
    drop(a);
    assert_eq!(live(), "0");
}

#[test]
fn sessions_are_bounded_checked_and_freed() {
    let mut mem = mem(0x10000, true);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let s = session(&mut q, &mut mem, alg, &[1; 16]);
    // Unknown and stale handles.
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s + 1, F_ENCRYPT | F_IV, BASE, BASE, 16, &[0; 16]),
    );
    assert_eq!(d.status, -2);
    assert_eq!(
        run(&mut q, &mut mem, SessionFree { session: s }.encode()).status,
        0
    );
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s, F_ENCRYPT | F_IV, BASE, BASE, 16, &[0; 16]),
    );
    assert_eq!(d.status, -2, "freed handle");
    let s2 = session(&mut q, &mut mem, alg, &[1; 16]);
    assert_ne!(s2, s, "a reused slot gets a new generation");
    // Chaining without an IV first, wrong lengths, wrong queue type.
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s2, F_ENCRYPT, BASE, BASE, 16, &[]),
    );
    assert_eq!(d.status, -22);
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s2, F_ENCRYPT | F_IV, BASE, BASE, 15, &[0; 16]),
    );
    assert_eq!(d.status, -22);
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s2, F_ENCRYPT | F_IV, BASE, BASE, 16, &[0; 8]),
    );
    assert_eq!(d.status, -22);
    let d = run(
        &mut q,
        &mut mem,
        SessionNew::new(Alg::Digest(Hash::Sha1), &[], 0).encode(),
    );
    assert_eq!(d.status, -95, "a cipher queue serves no digests");
    // Faults: data outside device memory.
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(s2, F_ENCRYPT | F_IV, 0x10, BASE, 16, &[0; 16]),
    );
    assert_eq!(d.status, -14);
    // The table is bounded.
    let mut n = q.session_count();
    loop {
        let d = run(&mut q, &mut mem, SessionNew::new(alg, &[1; 16], 0).encode());
        if d.status != 0 {
            assert_eq!(d.status, -28);
            break;
        }
        n += 1;
    }
    assert_eq!(n, msg::MAX_SESSIONS);
}

#[test]
fn long_hmac_keys_travel_by_address() {
    let key = vec![0xaa; 131];
    // RFC 4231 test case 6.
    let data = b"Test Using Larger Than Block-Size Key - Hash Key First";
    let want = hex("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    let mut mem = mem(0x10000, false);
    mem.put(BASE, data);
    let mut q = SecQueue::new(TYPE_DIGEST);
    let s = session(&mut q, &mut mem, Alg::Hmac(Hash::Sha256), &key);
    let d = run(
        &mut q,
        &mut mem,
        DigestOp {
            session: s,
            alg: None,
            flags: F_INIT | F_DIGEST_FINAL,
            src: BASE,
            len: data.len() as u64,
            out: BASE + 0x100,
        }
        .encode(),
    );
    assert_eq!((d.status, d.result), (0, 32));
    assert_eq!(mem.get(BASE + 0x100, 32), want);
}

/// Issue 9: a queue's `bytes` counter counts data, not session handles.
#[test]
fn bytes_count_data_not_handles() {
    let mut mem = mem(0x10000, true);
    let mut q = SecQueue::new(TYPE_CIPHER);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let key_addr = BASE + 0x8000;
    let new = run(
        &mut q,
        &mut mem,
        SessionNew::new(alg, &[1; 16], key_addr).encode(),
    );
    assert_eq!(new.status, 0);
    assert_ne!(new.result, 0, "a handle");
    assert_eq!(q.bytes_of(&new), 0);
    let d = run(
        &mut q,
        &mut mem,
        cipher_op(new.result, F_ENCRYPT | F_IV, BASE, BASE, 64, &[0; 16]),
    );
    assert_eq!(d.status, 0);
    assert_eq!(q.bytes_of(&d), 64);
    let free = run(
        &mut q,
        &mut mem,
        SessionFree {
            session: new.result,
        }
        .encode(),
    );
    assert_eq!(q.bytes_of(&free), 0);
}

/// A request that faults changes nothing: in a domain with the stall
/// policy the engine runs it again from the start once the fault is
/// resolved, so a chained part whose output (or a digest part whose
/// input) faulted must leave the chain (or the running hash) as it was.
#[test]
fn a_request_that_faults_changes_nothing() {
    let outside = BASE + 0x10000 - 16;
    for direct in [true, false] {
        for name in ["aes-128-cbc", "aes-128-ctr"] {
            let mut mem = mem(0x10000, direct);
            let mut q = SecQueue::new(TYPE_CIPHER);
            let alg = Alg::by_name(name).unwrap();
            let (key, iv) = ([7u8; 16], [9u8; 16]);
            let s = session(&mut q, &mut mem, alg, &key);
            let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
            mem.put(BASE, &data);
            let (src, dst) = (BASE, BASE + 0x2000);
            let first = run(
                &mut q,
                &mut mem,
                cipher_op(s, F_ENCRYPT | F_IV, src, dst, 2048, &iv),
            );
            assert_eq!(first.status, 0);
            // The second part's output runs past the memory.
            let bad = cipher_op(s, F_ENCRYPT, src + 2048, outside, 2048, &[]);
            assert_eq!(run(&mut q, &mut mem, bad).status, status::EFAULT, "{name}");
            let again = cipher_op(s, F_ENCRYPT, src + 2048, dst + 2048, 2048, &[]);
            assert_eq!(run(&mut q, &mut mem, again).status, 0);
            assert!(
                mem.get(dst, 4096) == reference(alg, &key, &iv, &data, true),
                "{name}, direct {direct}: the retried part continues the chain"
            );
        }
        let mut mem = mem(0x10000, direct);
        let mut q = SecQueue::new(TYPE_DIGEST);
        let d = run(
            &mut q,
            &mut mem,
            SessionNew::new(Alg::Digest(Hash::Sha256), &[], 0).encode(),
        );
        assert_eq!(d.status, 0);
        let s = d.result;
        let data = vec![5u8; 4096];
        mem.put(BASE, &data);
        let out = BASE + 0x8000;
        let part = |flags, src| {
            DigestOp {
                session: s,
                alg: None,
                flags,
                src,
                len: 2048,
                out,
            }
            .encode()
        };
        assert_eq!(run(&mut q, &mut mem, part(F_INIT, BASE)).status, 0);
        assert_eq!(
            run(&mut q, &mut mem, part(F_DIGEST_FINAL, outside)).status,
            status::EFAULT
        );
        assert_eq!(
            run(&mut q, &mut mem, part(F_DIGEST_FINAL, BASE + 2048)).status,
            0
        );
        let want = openssl::sha::sha256(&data);
        assert_eq!(mem.get(out, 32), want.to_vec(), "direct {direct}");
    }
}

/// Long requests cut in pieces (for fair service) give exactly the whole
/// request's output, chaining state, tag and digest.
#[test]
fn pieces_equal_whole_requests() {
    let len = 300 << 10;
    let data: Vec<u8> = (0..len + 7).map(|i| (i * 31 % 251) as u8).collect();
    // Clear of `session`'s key at BASE + 0x8000.
    let (src, a, b, aad_at, tag_at) = (
        BASE + 0x10000,
        BASE + 0x80000,
        BASE + 0x100000,
        BASE + 0x180000,
        BASE + 0x181000,
    );
    for (name, n, cuttable) in [
        ("aes-128-cbc", len, true),
        ("aes-256-ecb", len, true),
        ("aes-128-ctr", len + 7, true),
        ("aes-128-gcm", len + 7, true),
        ("aes-256-xts", len, false),
    ] {
        let alg = Alg::by_name(name).unwrap();
        let key: Vec<u8> = (0..alg.key_len() as u8).collect();
        let mut mem = mem(0x200000, true);
        mem.put(src, &data[..n]);
        mem.put(aad_at, b"additional data");
        let (mut whole_q, mut piece_q) = (SecQueue::new(TYPE_CIPHER), SecQueue::new(TYPE_CIPHER));
        let s1 = session(&mut whole_q, &mut mem, alg, &key);
        let s2 = session(&mut piece_q, &mut mem, alg, &key);
        let gcm = name.ends_with("gcm");
        let op = |s: u64, flags: u16, from: u64, to: u64| {
            let mut d = cipher_op(s, flags, from, to, n, &[7u8; 16][..alg.iv_len()]);
            if gcm {
                let mut c = match wd_sec::msg::decode(&d).unwrap() {
                    wd_sec::msg::Request::Cipher(c) => c,
                    _ => unreachable!(),
                };
                c.flags |= F_FINAL;
                (c.aad, c.aad_len, c.tag, c.tag_len) = (aad_at, 15, tag_at, 16);
                d = c.encode();
            }
            d
        };
        let w = run(&mut whole_q, &mut mem, op(s1, F_ENCRYPT | F_IV, src, a));
        assert_eq!(w.status, 0, "{name}");
        let want_tag = mem.get(tag_at, 16);
        let (p, calls) = run_in_pieces(&mut piece_q, &mut mem, op(s2, F_ENCRYPT | F_IV, src, b), 1);
        assert_eq!((p.status, p.result), (0, n as u64), "{name}");
        assert_eq!(calls > 1, cuttable, "{name}: {calls} calls");
        assert!(
            mem.get(a, n) == mem.get(b, n),
            "{name}: pieces differ from the whole"
        );
        assert_eq!(mem.get(tag_at, 16), want_tag, "{name}: tag");
        if !gcm && name != "aes-256-xts" {
            // The chaining state after the pieces is the whole request's:
            // a chained continuation agrees on both queues.
            let w = run(
                &mut whole_q,
                &mut mem,
                cipher_op(s1, F_ENCRYPT, src, a, 4096, &[]),
            );
            let p = run(
                &mut piece_q,
                &mut mem,
                cipher_op(s2, F_ENCRYPT, src, b, 4096, &[]),
            );
            assert_eq!((w.status, p.status), (0, 0));
            assert!(
                mem.get(a, 4096) == mem.get(b, 4096),
                "{name}: chaining state"
            );
        }
        if gcm {
            // A whole GCM decryption is cut too: decrypted and checked a
            // piece at a time, then written out.
            mem.put(a, &vec![0; n]);
            let (d, calls) = run_in_pieces(&mut piece_q, &mut mem, op(s2, F_IV, b, a), 1);
            assert_eq!((d.status, d.result), (0, n as u64));
            assert!(calls > 2 * (n / (64 << 10)), "{calls} calls");
            let got = mem.get(a, n);
            let first = got.iter().zip(&data[..n]).position(|(x, y)| x != y);
            assert!(
                first.is_none(),
                "{name}: decrypted text differs from byte {first:?}"
            );
        }
    }
    // Digests: one long request against the same in pieces.
    for alg in [Alg::Digest(Hash::Sha256), Alg::Hmac(Hash::Sha1)] {
        let mut mem = mem(0x200000, true);
        mem.put(src, &data);
        let (mut q1, mut q2) = (SecQueue::new(TYPE_DIGEST), SecQueue::new(TYPE_DIGEST));
        let key = if matches!(alg, Alg::Hmac(_)) {
            &b"key"[..]
        } else {
            &[][..]
        };
        let s1 = session(&mut q1, &mut mem, alg, key);
        let s2 = session(&mut q2, &mut mem, alg, key);
        let op = |s: u64, out: u64| {
            DigestOp {
                session: s,
                alg: None,
                flags: F_INIT | F_DIGEST_FINAL,
                src,
                len: data.len() as u64,
                out,
            }
            .encode()
        };
        let w = run(&mut q1, &mut mem, op(s1, a));
        let (p, calls) = run_in_pieces(&mut q2, &mut mem, op(s2, b), 1);
        assert_eq!((w.status, p.status, w.result), (0, 0, p.result));
        assert!(calls > 1);
        assert_eq!(mem.get(a, 64), mem.get(b, 64), "{alg:?}");
    }
}

/// Run a batch as the engine does: start every request, then poll; the
/// requests held come back through `poll`, each exactly once.
fn run_batch(q: &mut SecQueue, mem: &mut Mem, batch: &[Desc]) -> Vec<Desc> {
    let mut out: Vec<Option<Desc>> = vec![None; batch.len()];
    let mut held = 0;
    let mut done = Vec::new();
    let t0 = std::time::Instant::now();
    q.batch(batch.len());
    let mut i = 0;
    while i < batch.len() {
        let mut d = batch[i];
        match q.start(i as u64, &mut d, mem) {
            Started::Done => out[i] = Some(d),
            Started::Held => held += 1,
            Started::Cut => out[i] = Some(run_in_pieces(q, mem, d, 256 << 10).0),
            Started::Later => {
                // As the engine does: it waits for a later pass (the
                // device's polls go on meanwhile).
                q.poll(&mut done);
                assert!(t0.elapsed().as_secs() < 5, "a request waits for ever");
                continue;
            }
        }
        i += 1;
    }
    assert_eq!(q.in_flight() + done.len(), held);
    // As the engine does: poll until the device has reported everything
    // (it may wait a little for more requests to join a burst).
    while q.in_flight() > 0 {
        q.poll(&mut done);
        assert!(t0.elapsed().as_secs() < 5, "held requests never reported");
    }
    assert_eq!(done.len(), held, "every held request is reported");
    for (t, d) in done {
        assert!(out[t as usize].replace(d).is_none(), "reported twice");
    }
    assert_eq!(q.in_flight(), 0);
    out.into_iter().map(|d| d.expect("completed")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Streams of every CBC key size (both directions), CTR and ECB on one
    /// queue whose CBC encryptions go through the multi-buffer engine:
    /// random batch make-ups (a message's next part in the same batch as
    /// its previous one too), random switches between held memory, in
    /// place and bounce, equal OpenSSL's one-shot result per message.
    #[test]
    fn batches_through_the_multi_buffer_engine_match_openssl(
        streams in prop::collection::vec(
            (0usize..8, any::<[u8; 32]>(), any::<[u8; 16]>(), prop::collection::vec(1usize..6, 1..6)),
            1..10),
        batch_sizes in prop::collection::vec(1usize..12, 1..30),
        direct in prop::collection::vec(any::<bool>(), 30),
        seed in any::<u64>(),
    ) {
        let Some(e) = mb_engine("batches_through_the_multi_buffer_engine_match_openssl") else {
            return Ok(());
        };
        let algs = [
            ("aes-128-cbc", true), ("aes-192-cbc", true), ("aes-256-cbc", true),
            ("aes-128-cbc", false), ("aes-256-cbc", false),
            ("aes-128-ctr", true), ("aes-256-ecb", true), ("aes-128-cbc", true),
        ];
        let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
        prop_assert!(q.asynchronous());
        let mut mem = mem(1 << 20, true);
        // Each stream: its session, parts (in blocks) and where they live.
        struct Stream { alg: Alg, encrypt: bool, key: Vec<u8>, iv: [u8; 16], plain: Vec<u8>, parts: Vec<(u64, u64, usize)>, next: usize }
        let mut all = Vec::new();
        let mut at = BASE + 0x1_0000;
        for (k, (a, key, iv, parts)) in streams.iter().enumerate() {
            let (name, encrypt) = algs[*a];
            let alg = Alg::by_name(name).unwrap();
            let key = key[..alg.key_len()].to_vec();
            let total: usize = parts.iter().sum::<usize>() * 16;
            let plain: Vec<u8> = (0..total).map(|i| (seed.wrapping_mul(i as u64 * 31 + k as u64 + 1) >> 17) as u8).collect();
            let mut off = 0;
            let mut placed = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let n = p * 16;
                let src = at;
                let dst = if (k + j) % 3 == 0 { src } else { src + n as u64 };
                mem.put(src, &plain[off..off + n]);
                placed.push((src, dst, n));
                at += 2 * n as u64 + 64;
                off += n;
            }
            all.push(Stream { alg, encrypt, key, iv: *iv, plain, parts: placed, next: 0 });
        }
        let sessions: Vec<u64> = all.iter().map(|s| session(&mut q, &mut mem, s.alg, &s.key)).collect();
        let mut rng = seed | 1;
        let mut b = 0;
        while all.iter().any(|s| s.next < s.parts.len()) {
            let want = batch_sizes[b % batch_sizes.len()];
            set_direct(&mut mem, direct[b % direct.len()]);
            b += 1;
            let mut batch = Vec::new();
            while batch.len() < want && all.iter().any(|s| s.next < s.parts.len()) {
                rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                let k = (rng % all.len() as u64) as usize;
                let s = &mut all[k];
                if s.next == s.parts.len() { continue; }
                let (src, dst, n) = s.parts[s.next];
                let mut flags = if s.encrypt { F_ENCRYPT } else { 0 };
                let iv: &[u8] = if s.alg.iv_len() == 0 { &[] } else { &s.iv };
                if s.next == 0 { flags |= F_IV; }
                batch.push(cipher_op(sessions[k], flags, src, dst, n, iv));
                s.next += 1;
            }
            for d in run_batch(&mut q, &mut mem, &batch) {
                prop_assert_eq!(d.status, 0);
            }
        }
        for s in &all {
            let got: Vec<u8> = s.parts.iter().flat_map(|&(_, dst, n)| mem.get(dst, n)).collect();
            let iv: &[u8] = if s.alg.iv_len() == 0 { &[] } else { &s.iv };
            prop_assert_eq!(got, reference(s.alg, &s.key, iv, &s.plain, s.encrypt), "{}", s.alg.name());
        }
    }
}

/// A continuation without an IV on a multi-buffer stream that never
/// started, or after a decryption started on the session, is refused; a
/// malformed request keeps the stream's state.
#[test]
fn multi_buffer_streams_check_their_chaining() {
    let Some(e) = mb_engine("multi_buffer_streams_check_their_chaining") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(1 << 16, true);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let key = [3u8; 16];
    let iv = [9u8; 16];
    let s = session(&mut q, &mut mem, alg, &key);
    let (src, dst) = (BASE + 0x1000, BASE + 0x2000);
    let plain: Vec<u8> = (0..64u8).collect();
    mem.put(src, &plain);
    let cont = cipher_op(s, F_ENCRYPT, src, dst, 32, &iv);
    assert_eq!(
        run_batch(&mut q, &mut mem, &[cont])[0].status,
        status::EINVAL
    );
    let first = cipher_op(s, F_ENCRYPT | F_IV, src, dst, 32, &iv);
    let odd = cipher_op(s, F_ENCRYPT, src + 32, dst + 32, 20, &iv);
    let second = cipher_op(s, F_ENCRYPT, src + 32, dst + 32, 32, &iv);
    let out = run_batch(&mut q, &mut mem, &[first, odd, second]);
    assert_eq!(
        (out[0].status, out[1].status, out[2].status),
        (0, status::EINVAL, 0)
    );
    assert_eq!(mem.get(dst, 64), reference(alg, &key, &iv, &plain, true));
    // A decryption starts: the encryption stream is over.
    let dec = cipher_op(s, F_IV, dst, src, 64, &iv);
    let again = cipher_op(s, F_ENCRYPT, src, dst, 16, &iv);
    let out = run_batch(&mut q, &mut mem, &[dec, again]);
    assert_eq!((out[0].status, out[1].status), (0, status::EINVAL));
    assert_eq!(mem.get(src, 64), plain);
}

/// On a queue with the multi-buffer engine (asynchronous), a request
/// longer than 1 MiB is held and run a piece per poll, so one poll never
/// does all of it; a later request of its session waits for it (handed
/// back to the engine until then: it finished the long one whole in
/// `start`, holding the engine's other queues), another session's does
/// not; the results equal OpenSSL's.
#[test]
fn long_requests_run_in_pieces_in_order() {
    let Some(e) = mb_engine("long_requests_run_in_pieces_in_order") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(12 << 20, true);
    let cbc = Alg::by_name("aes-128-cbc").unwrap();
    let ctr = Alg::by_name("aes-256-ctr").unwrap();
    let (k1, k2) = ([5u8; 16], [6u8; 32]);
    let iv = [7u8; 16];
    let s1 = session(&mut q, &mut mem, cbc, &k1);
    let s2 = session(&mut q, &mut mem, ctr, &k2);
    let long = 3 << 20;
    let (src, dst) = (BASE + 0x10_0000, BASE + 0x50_0000);
    let plain: Vec<u8> = (0..long + 4096).map(|i| (i * 131 % 251) as u8).collect();
    mem.put(src, &plain);
    let (src2, dst2) = (BASE + 0x90_0000, BASE + 0xa0_0000);
    mem.put(src2, &plain[..4096]);
    // The long request alone first: it is held, and one poll leaves it
    // unfinished.
    let first = cipher_op(s1, F_ENCRYPT | F_IV, src, dst, long, &iv);
    q.batch(1);
    let mut d = first;
    assert_eq!(q.start(0, &mut d, &mut mem), Started::Held);
    let mut done = Vec::new();
    q.poll(&mut done);
    assert!(done.is_empty(), "3 MiB done in one poll");
    assert_eq!(q.in_flight(), 1);
    // Another session's request completes while the long one goes on;
    // its own session's continuation waits for it (then runs after it).
    let other = cipher_op(s2, F_ENCRYPT | F_IV, src2, dst2, 4096, &iv);
    let next = cipher_op(
        s1,
        F_ENCRYPT,
        src + long as u64,
        dst + long as u64,
        4096,
        &iv,
    );
    q.batch(2);
    let mut results = std::collections::HashMap::new();
    let mut waiting = vec![(1u64, other), (2, next)];
    let t0 = std::time::Instant::now();
    let mut polls_waited = 0;
    while !waiting.is_empty() || q.in_flight() > 0 {
        // As the engine does: a request handed back waits, with those
        // after it, for a later pass.
        while let Some(&(t, d)) = waiting.first() {
            let mut d = d;
            match q.start(t, &mut d, &mut mem) {
                Started::Done => {
                    results.insert(t, d);
                }
                Started::Cut => {
                    results.insert(t, run_in_pieces(&mut q, &mut mem, d, 256 << 10).0);
                }
                Started::Held => {}
                Started::Later => {
                    assert_eq!(t, 2, "only the long request's own session waits");
                    polls_waited += 1;
                    break;
                }
            }
            waiting.remove(0);
        }
        q.poll(&mut done);
        assert!(t0.elapsed().as_secs() < 5);
    }
    assert!(
        polls_waited > 1,
        "the continuation waited over polls (the long request was finished at once in start)"
    );
    for (t, d) in done.drain(..) {
        assert!(results.insert(t, d).is_none(), "reported twice");
    }
    assert_eq!(results.len(), 3);
    assert!(results.values().all(|d| d.status == 0));
    assert_eq!(
        mem.get(dst, long + 4096),
        reference(cbc, &k1, &iv, &plain, true)
    );
    assert_eq!(
        mem.get(dst2, 4096),
        reference(ctr, &k2, &iv, &plain[..4096], true)
    );
}

/// A long request whose memory cannot be held (a SHARE_ALL queue's, or
/// split across mappings) is left to the engine, which runs it in pieces
/// of its passes' budget; the session's next request chains on from it.
/// A short one still runs at once.
#[test]
fn a_long_request_that_cannot_be_held_is_cut_by_the_engine() {
    let Some(e) = mb_engine("a_long_request_that_cannot_be_held_is_cut_by_the_engine") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(8 << 20, false);
    let cbc = Alg::by_name("aes-128-cbc").unwrap();
    let (key, iv) = ([9u8; 16], [3u8; 16]);
    let s = session(&mut q, &mut mem, cbc, &key);
    let long = 2 << 20;
    let (src, dst) = (BASE + 0x10_0000, BASE + 0x40_0000);
    let plain: Vec<u8> = (0..long + 4096).map(|i| (i * 7 % 253) as u8).collect();
    mem.put(src, &plain);
    q.batch(1);
    let mut d = cipher_op(s, F_ENCRYPT | F_IV, src, dst, long, &iv);
    assert_eq!(q.start(0, &mut d, &mut mem), Started::Cut);
    let (d, calls) = run_in_pieces(&mut q, &mut mem, d, 256 << 10);
    assert_eq!(calls, 8, "2 MiB in 256 KiB pieces");
    assert_eq!((d.status, d.result), (0, long as u64));
    let mut next = cipher_op(
        s,
        F_ENCRYPT,
        src + long as u64,
        dst + long as u64,
        4096,
        &iv,
    );
    q.batch(1);
    assert_eq!(q.start(1, &mut next, &mut mem), Started::Done);
    assert_eq!(next.status, 0);
    assert_eq!(
        mem.get(dst, long + 4096),
        reference(cbc, &key, &iv, &plain, true)
    );
}

/// Teardown hands back a request the engine ran but had not reported yet
/// with its outcome (it was reported cancelled though its output was
/// written), and one still gathered as cancelled.
#[test]
fn teardown_reports_what_finished_as_finished() {
    let Some(e) = mb_engine("teardown_reports_what_finished_as_finished") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(1 << 16, true);
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let (key, iv) = ([3u8; 16], [9u8; 16]);
    let s = session(&mut q, &mut mem, alg, &key);
    let (src, dst) = (BASE + 0x1000, BASE + 0x2000);
    let plain: Vec<u8> = (0..64u8).collect();
    mem.put(src, &plain);
    // The second part of the message makes the first run (it must finish
    // first) and is gathered in its turn.
    let first = cipher_op(s, F_ENCRYPT | F_IV, src, dst, 32, &iv);
    let second = cipher_op(s, F_ENCRYPT, src + 32, dst + 32, 32, &iv);
    q.batch(2);
    for (t, d) in [(0u64, first), (1, second)] {
        let mut d = d;
        assert_eq!(q.start(t, &mut d, &mut mem), Started::Held);
    }
    let got = common::abort_outcomes(&mut q);
    assert_eq!(got, vec![(0, 0, 32), (1, status::ECANCELED, 0)]);
    assert_eq!(
        mem.get(dst, 32),
        reference(alg, &key, &iv, &plain[..32], true)
    );
    assert_eq!(q.in_flight(), 0);
}

/// A whole GCM decryption longer than a piece is cut (a pass would hold
/// every other queue of the engine as long as 64 MiB takes), and still
/// releases no plaintext unless the tag matches: a wrong tag is -EBADMSG
/// with the destination untouched; memory that fails in a later piece
/// fails the request with the destination untouched and the message
/// lost. On a multi-buffer queue (asynchronous) the engine cuts it too.
#[test]
fn a_long_gcm_decryption_is_cut_and_checked_before_its_output() {
    let alg = Alg::by_name("aes-256-gcm").unwrap();
    let key = [5u8; 32];
    let n = (1 << 20) + 13;
    let plain = common::data(n, 4);
    let (src, dst, aad, tag) = (
        BASE + 0x10_0000,
        BASE + 0x30_0000,
        BASE + 0x50_0000,
        BASE + 0x50_1000,
    );
    let op = |s: u64, flags: u16, from: u64, to: u64| {
        gcm_message(s, flags, (from, to, n), (aad, 9), (tag, 16))
    };
    let engines = queue_engines("a_long_gcm_decryption_is_cut_and_checked_before_its_output");
    for e in engines {
        let mut q = SecQueue::with_engine(TYPE_CIPHER, e);
        let mut mem = mem(8 << 20, true);
        let s = session(&mut q, &mut mem, alg, &key);
        mem.put(src, &plain);
        mem.put(aad, b"header 12");
        let sealed = run(&mut q, &mut mem, op(s, F_ENCRYPT, src, dst));
        assert_eq!(sealed.status, 0);
        let (ct, good) = (mem.get(dst, n), mem.get(tag, 16));
        let open = |q: &mut SecQueue, mem: &mut Mem| {
            mem.put(src, &vec![0xee; n]);
            let mut d = op(s, 0, dst, src);
            if e.is_some() {
                q.batch(1);
                assert_eq!(q.start(0, &mut d, mem), Started::Cut);
            }
            run_in_pieces(q, mem, d, 64 << 10)
        };
        let (d, calls) = open(&mut q, &mut mem);
        assert_eq!(
            (d.status, d.result),
            (0, n as u64),
            "engine {}",
            e.is_some()
        );
        assert!(calls > 2 * (n >> 16), "{calls} calls");
        assert!(mem.get(src, n) == plain, "engine {}", e.is_some());
        // A wrong tag: nothing written.
        let mut bad = good.clone();
        bad[3] ^= 1;
        mem.put(tag, &bad);
        let (d, calls) = open(&mut q, &mut mem);
        assert_eq!(d.status, status::EBADMSG);
        assert!(calls > n >> 16);
        assert!(
            mem.get(src, n).iter().all(|&b| b == 0xee),
            "no plaintext out"
        );
        // Ciphertext that cannot be read after the first pieces: the
        // request fails, nothing is written, and the message is lost (a
        // continuation of it is refused).
        mem.put(tag, &good);
        mem.put(src, &vec![0xee; n]);
        let mut d = op(s, 0, dst, src);
        if e.is_some() {
            q.batch(1);
            assert_eq!(q.start(0, &mut d, &mut mem), Started::Cut);
        }
        let mut done = 0;
        for _ in 0..3 {
            let Progress::More(upto) = q.process_part(&mut d, &mut mem, done, 64 << 10) else {
                panic!("a piece ended it")
            };
            done = upto;
        }
        mem.set_hole(Some((dst + (512 << 10), dst + (516 << 10))));
        while let Progress::More(upto) = q.process_part(&mut d, &mut mem, done, 64 << 10) {
            done = upto;
        }
        mem.set_hole(None);
        assert_eq!(d.status, status::EFAULT);
        assert!(
            mem.get(src, n).iter().all(|&b| b == 0xee),
            "no plaintext out"
        );
        let next = cipher_op(s, 0, dst, src, 16, &[]);
        assert_eq!(run(&mut q, &mut mem, next).status, status::EINVAL);
        // And the session opens the next message.
        let (d, _) = open(&mut q, &mut mem);
        assert_eq!(d.status, 0);
        assert!(mem.get(src, n) == plain);
        assert_eq!(ct, mem.get(dst, n));
    }
}

/// An XTS request longer than a piece is cut into data-unit calls (each
/// given the IV that makes its starting tweak) and gives OpenSSL's whole
/// answer, in both directions, with and without a stolen tail, whatever
/// is left for the last piece; one over 2^20 blocks is still refused.
/// On a multi-buffer queue the engine cuts it too.
#[test]
fn a_long_xts_request_is_cut_into_data_unit_calls() {
    const MIB: usize = 1 << 20;
    let engines = queue_engines("a_long_xts_request_is_cut_into_data_unit_calls");
    let (src, dst) = (BASE + 0x10_0000, BASE + 0x50_0000);
    for e in engines {
        for (name, key_len) in [("aes-128-xts", 32usize), ("aes-256-xts", 64)] {
            let alg = Alg::by_name(name).unwrap();
            let key: Vec<u8> = (0..key_len as u8)
                .map(|i| i.wrapping_mul(37) ^ 0x5a)
                .collect();
            let iv: Vec<u8> = (0..16u8).map(|i| i * 3 + 1).collect();
            // Whole pieces, a tail, a last piece of a block and a tail,
            // and a last piece of at most a piece and a block.
            for n in [3 * MIB, 2 * MIB + 5, 2 * MIB + 16 + 3, MIB + 10, MIB + 16] {
                let data = common::data(n, n);
                for encrypt in [true, false] {
                    let mut q = SecQueue::with_engine(TYPE_CIPHER, e);
                    let mut mem = mem(12 << 20, true);
                    let s = session(&mut q, &mut mem, alg, &key);
                    mem.put(src, &data);
                    let flags = if encrypt { F_ENCRYPT | F_IV } else { F_IV };
                    let mut d = cipher_op(s, flags, src, dst, n, &iv);
                    if e.is_some() {
                        q.batch(1);
                        assert_eq!(q.start(0, &mut d, &mut mem), Started::Cut);
                    }
                    let (d, calls) = run_in_pieces(&mut q, &mut mem, d, 1);
                    let what = format!("{name} {n} encrypt {encrypt} engine {}", e.is_some());
                    assert_eq!((d.status, d.result), (0, n as u64), "{what}");
                    // Pieces of a MiB, the last with up to a block more.
                    let (mut left, mut pieces) = (n, 1);
                    while left > MIB + 16 {
                        (left, pieces) = (left - MIB, pieces + 1);
                    }
                    assert_eq!(calls, pieces, "{what}");
                    assert!(
                        mem.get(dst, n) == reference(alg, &key, &iv, &data, encrypt),
                        "{what}"
                    );
                }
            }
            let mut q = SecQueue::with_engine(TYPE_CIPHER, e);
            let mut mem = mem(40 << 20, true);
            let s = session(&mut q, &mut mem, alg, &key);
            let d = cipher_op(
                s,
                F_ENCRYPT | F_IV,
                src,
                src + (17 << 20),
                16 * MIB + 16,
                &iv,
            );
            let (d, _) = run_in_pieces(&mut q, &mut mem, d, 1);
            assert_eq!(d.status, status::EMSGSIZE, "{name}");
        }
    }
}

/// A whole GCM decryption with a tag shorter than 4 bytes is refused
/// (-EINVAL, nothing written) whether or not it is long enough to be cut:
/// a request cut in pieces must be held to what the whole one is, and a
/// tag of a byte or two is forged in a few hundred tries.
#[test]
fn a_long_gcm_decryption_refuses_a_short_tag_as_a_short_one_does() {
    let alg = Alg::by_name("aes-128-gcm").unwrap();
    let key = [7u8; 16];
    let (src, dst, tag) = (BASE + 0x10_0000, BASE + 0x30_0000, BASE + 0x50_1000);
    for n in [4096usize, (1 << 20) + 3] {
        let op = |s: u64, flags: u16, from: u64, to: u64, tag_len: u8| {
            gcm_message(s, flags, (from, to, n), (0, 0), (tag, tag_len))
        };
        let mut q = SecQueue::new(TYPE_CIPHER);
        let mut mem = mem(8 << 20, true);
        let s = session(&mut q, &mut mem, alg, &key);
        mem.put(src, &common::data(n, 3));
        assert_eq!(
            run(&mut q, &mut mem, op(s, F_ENCRYPT, src, dst, 16)).status,
            0
        );
        // The first two bytes of the right tag, given as a 2-byte tag.
        mem.put(src, &vec![0xee; n]);
        let (d, _) = run_in_pieces(&mut q, &mut mem, op(s, 0, dst, src, 2), 64 << 10);
        assert_eq!(d.status, status::EINVAL, "{n} bytes");
        assert!(
            mem.get(src, n).iter().all(|&b| b == 0xee),
            "{n} bytes: nothing written"
        );
    }
}

/// An XTS request cut in pieces goes on as one when a later pass has a
/// larger budget than its first (`pass_bytes` over a MiB, the first piece
/// run after other requests spent part of the pass): it is not taken for
/// a request the XTS cut does not serve, whose continuation is refused.
#[test]
fn a_cut_xts_request_goes_on_when_the_budget_grows() {
    let alg = Alg::by_name("aes-128-xts").unwrap();
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(29) ^ 0x33).collect();
    let iv: Vec<u8> = (0..16u8).map(|i| i * 5 + 2).collect();
    let n = (3 << 19) + 7;
    let (src, dst) = (BASE + 0x10_0000, BASE + 0x50_0000);
    let data = common::data(n, 11);
    for encrypt in [true, false] {
        let mut q = SecQueue::new(TYPE_CIPHER);
        let mut mem = mem(12 << 20, true);
        let s = session(&mut q, &mut mem, alg, &key);
        mem.put(src, &data);
        let flags = if encrypt { F_ENCRYPT | F_IV } else { F_IV };
        let mut d = cipher_op(s, flags, src, dst, n, &iv);
        let Progress::More(done) = q.process_part(&mut d, &mut mem, 0, 64 << 10) else {
            panic!("not cut")
        };
        assert!(matches!(
            q.process_part(&mut d, &mut mem, done, 4 << 20),
            Progress::Done
        ));
        assert_eq!((d.status, d.result), (0, n as u64), "encrypt {encrypt}");
        assert!(
            mem.get(dst, n) == reference(alg, &key, &iv, &data, encrypt),
            "encrypt {encrypt}"
        );
    }
}

/// A digest or HMAC session copied mid-message: both go on alone, each
/// to OpenSSL's answer for its own data; the copy is a session of its own
/// (freed alone); a cipher session, a handle that names nothing and a
/// malformed request are refused.
#[test]
fn a_digest_session_is_copied_with_its_message() {
    let mut mem = mem(0x40000, true);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (src, out_a, out_b) = (BASE, BASE + 0x10000, BASE + 0x10100);
    mem.put(src, &data);
    let key = [9u8; 100];
    for hmac in [false, true] {
        let mut q = SecQueue::new(TYPE_DIGEST);
        let alg = if hmac {
            Alg::Hmac(Hash::Sha256)
        } else {
            Alg::Digest(Hash::Sha256)
        };
        let s = session(&mut q, &mut mem, alg, if hmac { &key } else { &[] });
        let op = |session, flags, from: usize, to: usize, out| {
            DigestOp {
                session,
                alg: None,
                flags,
                src: src + from as u64,
                len: (to - from) as u64,
                out,
            }
            .encode()
        };
        assert_eq!(run(&mut q, &mut mem, op(s, F_INIT, 0, 5000, 0)).status, 0);
        let d = run(&mut q, &mut mem, msg::SessionClone { session: s }.encode());
        assert_eq!(d.status, 0, "hmac {hmac}");
        let c = d.result;
        assert_ne!(c, s);
        // The original takes the rest; the copy other data.
        let d = run(&mut q, &mut mem, op(s, F_DIGEST_FINAL, 5000, 20_000, out_a));
        assert_eq!(d.status, 0);
        let d = run(&mut q, &mut mem, op(c, F_DIGEST_FINAL, 100, 900, out_b));
        assert_eq!(d.status, 0);
        let want = |m: &[u8]| {
            if hmac {
                let k = openssl::pkey::PKey::hmac(&key).unwrap();
                let mut s =
                    openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &k).unwrap();
                s.update(m).unwrap();
                s.sign_to_vec().unwrap()
            } else {
                openssl::sha::sha256(m).to_vec()
            }
        };
        assert_eq!(mem.get(out_a, 32), want(&data), "hmac {hmac}");
        let copied = [&data[..5000], &data[100..900]].concat();
        assert_eq!(mem.get(out_b, 32), want(&copied), "hmac {hmac}");
        // Each is a session of its own: freeing one leaves the other.
        let free = |h| SessionFree { session: h }.encode();
        assert_eq!(run(&mut q, &mut mem, free(s)).status, 0);
        let d = run(
            &mut q,
            &mut mem,
            op(c, F_INIT | F_DIGEST_FINAL, 0, 800, out_b),
        );
        assert_eq!(d.status, 0);
        assert_eq!(mem.get(out_b, 32), want(&data[..800]));
        // Refused: a handle that names nothing, a malformed request.
        let d = run(
            &mut q,
            &mut mem,
            msg::SessionClone { session: 12345 }.encode(),
        );
        assert!(d.status < 0);
        let mut bad = msg::SessionClone { session: c }.encode();
        bad.payload[20] = 1;
        assert_eq!(run(&mut q, &mut mem, bad).status, status::EINVAL);
    }
    // A cipher session's chain is not copied here.
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(
        &mut q,
        &mut mem,
        Alg::by_name("aes-128-cbc").unwrap(),
        &[1; 16],
    );
    let d = run(&mut q, &mut mem, msg::SessionClone { session: s }.encode());
    assert_eq!(d.status, status::EOPNOTSUPP);
}
