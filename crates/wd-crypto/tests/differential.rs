//! The libraries against OpenSSL's default provider (the `openssl` crate),
//! through an embedded host, with every request offloaded, with every
//! request on the CPU, and with a threshold that mixes both inside one
//! chained stream (the chain must survive every switch).

use std::sync::Mutex;

mod common;

use common::{ocipher, reference};
use proptest::prelude::*;
use wd_crypto::{config, stats, Aead, Cipher, CryptoError, Digest, Direction, Policy};
use wd_testutil::noise;

/// Settings are process-wide: tests that change them run one at a time.
static SETTINGS: Mutex<()> = Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    SETTINGS.lock().unwrap_or_else(|e| e.into_inner())
}

const STREAMS: [&str; 6] = [
    "aes-128-ecb",
    "aes-192-cbc",
    "aes-128-cbc",
    "aes-256-cbc",
    "aes-128-ctr",
    "aes-256-ctr",
];

fn set(policy: Policy, threshold: usize) {
    config::set_policy(policy);
    config::set_threshold(threshold);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn chained_ciphers_match_openssl_on_every_path(
        which in 0usize..STREAMS.len(),
        mix in 0usize..3,
        pieces in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(),
        encrypt in any::<bool>(),
    ) {
        let _g = setup();
        // 0: all offloaded, 1: all on the CPU, 2: mixed by size.
        match mix {
            0 => set(Policy::Offload, 0),
            1 => set(Policy::Cpu, 0),
            _ => set(Policy::Offload, 512),
        }
        let name = STREAMS[which];
        let ctr = name.ends_with("ctr");
        let key = noise(32, seed ^ 1);
        let key = &key[..wd_crypto::Alg::by_name(name).unwrap().key_len()];
        let iv = noise(16, seed ^ 2);
        let iv = if name.ends_with("ecb") { &iv[..0] } else { &iv[..] };
        let lens: Vec<usize> = pieces.iter().map(|&p| if ctr { p * 5 } else { p / 8 * 16 }).collect();
        let total: usize = lens.iter().sum();
        let data = noise(total, seed);
        let dir = if encrypt { Direction::Encrypt } else { Direction::Decrypt };
        let mut c = Cipher::new(name, key, dir).unwrap();
        if !iv.is_empty() {
            c.set_iv(iv).unwrap();
        }
        let mut out = vec![0u8; total];
        let mut off = 0;
        for &l in &lens {
            // Every other piece in place.
            let n = if (seed >> (off % 61)) & 1 == 1 {
                out[off..off + l].copy_from_slice(&data[off..off + l]);
                c.update_in_place(&mut out[off..off + l]).unwrap()
            } else {
                c.update(&data[off..off + l], &mut out[off..off + l]).unwrap()
            };
            prop_assert_eq!(n, l);
            off += l;
        }
        prop_assert_eq!(out, reference(name, key, iv, &data, encrypt));
    }

    /// Streams whose buffers are WrapDrive shared memory: the device works
    /// in them in place (counted), pieces alternate with staged ones
    /// (the chain crosses), the CPU path copies; overlapping spans are
    /// staged.
    #[test]
    fn shared_memory_streams_match_openssl(
        which in 0usize..STREAMS.len(),
        mix in 0usize..3,
        pieces in proptest::collection::vec(0usize..20000, 1..6),
        seed in any::<u64>(),
        encrypt in any::<bool>(),
    ) {
        let _g = setup();
        match mix {
            0 => set(Policy::Offload, 0),
            1 => set(Policy::Cpu, 0),
            _ => set(Policy::Offload, 4096),
        }
        let name = STREAMS[which];
        let ctr = name.ends_with("ctr");
        let key = noise(32, seed ^ 1);
        let key = &key[..wd_crypto::Alg::by_name(name).unwrap().key_len()];
        let iv = noise(16, seed ^ 2);
        let iv = if name.ends_with("ecb") { &iv[..0] } else { &iv[..] };
        let lens: Vec<usize> = pieces.iter().map(|&p| if ctr { p * 5 } else { p / 8 * 16 }).collect();
        let total: usize = lens.iter().sum();
        let data = noise(total, seed);
        let dir = if encrypt { Direction::Encrypt } else { Direction::Decrypt };
        let mut c = Cipher::new(name, key, dir).unwrap();
        if !iv.is_empty() {
            c.set_iv(iv).unwrap();
        }
        let src = wrapdrive::SharedBuf::new(total.max(1)).unwrap();
        let dst = wrapdrive::SharedBuf::new(total.max(1)).unwrap();
        src.write(0, &data);
        let (src, dst) = (wrapdrive::SharedSpan::of(&src), wrapdrive::SharedSpan::of(&dst));
        let before = stats().offload_in_place_bytes;
        let mut out = vec![0u8; total];
        let mut off = 0;
        let mut in_place = 0;
        for (i, &l) in lens.iter().enumerate() {
            if l == 0 {
                continue;
            }
            let at = off as u64;
            let n = match (seed >> (i * 2)) & 3 {
                // Staged, from local memory.
                0 => c.update(&data[off..off + l], &mut out[off..off + l]).unwrap(),
                // In place over one span: overlapping, so staged.
                1 => {
                    dst.write(at, &data[off..off + l]);
                    let s = dst.sub(at, l as u64);
                    let n = c.update_shared(s, s).unwrap();
                    dst.read(at, &mut out[off..off + l]);
                    n
                }
                _ => {
                    let n = c.update_shared(src.sub(at, l as u64), dst.sub(at, l as u64)).unwrap();
                    dst.read(at, &mut out[off..off + l]);
                    if mix == 0 || (mix == 2 && l >= 4096) {
                        in_place += l;
                    }
                    n
                }
            };
            prop_assert_eq!(n, l);
            off += l;
        }
        prop_assert_eq!(out, reference(name, key, iv, &data, encrypt));
        // Other tests run one at a time (SETTINGS), so the counter moved
        // by this stream alone; a CTR piece may start with a few bytes on
        // the CPU (mid-block), then the piece is staged.
        let moved = stats().offload_in_place_bytes - before;
        if ctr {
            prop_assert!(moved as usize <= in_place, "{} > {}", moved, in_place);
        } else {
            prop_assert_eq!(moved as usize, in_place);
        }
    }

    #[test]
    fn gcm_matches_openssl_and_rejects_bad_tags(
        big in any::<bool>(),
        offload in any::<bool>(),
        aad_len in 0usize..64,
        len in 0usize..3000,
        seed in any::<u64>(),
        flip in 0usize..128,
    ) {
        let _g = setup();
        set(if offload { Policy::Offload } else { Policy::Cpu }, 0);
        let name = if big { "aes-256-gcm" } else { "aes-128-gcm" };
        let key = noise(if big { 32 } else { 16 }, seed ^ 3);
        let iv = noise(12, seed ^ 4);
        let aad = noise(aad_len, seed ^ 5);
        let pt = noise(len, seed);
        let mut a = Aead::new(name, &key).unwrap();
        let mut ct = vec![0u8; len];
        let mut tag = [0u8; 16];
        a.seal(&iv, &aad, &pt, &mut ct, &mut tag).unwrap();
        let mut want_tag = [0u8; 16];
        let want = openssl::symm::encrypt_aead(ocipher(name), &key, Some(&iv), &aad, &pt, &mut want_tag).unwrap();
        prop_assert_eq!(&ct, &want);
        prop_assert_eq!(tag, want_tag);
        let mut back = vec![0u8; len];
        a.open(&iv, &aad, &ct, &tag, &mut back).unwrap();
        prop_assert_eq!(&back, &pt);
        let mut bad = tag;
        bad[flip / 8] ^= 1 << (flip % 8);
        let mut nothing = vec![0xeeu8; len];
        let e = a.open(&iv, &aad, &ct, &bad, &mut nothing).unwrap_err();
        prop_assert!(matches!(e, CryptoError::Auth), "{e}");
        prop_assert!(nothing.iter().all(|&b| b == 0), "plaintext released on a bad tag");
    }

    #[test]
    fn digests_match_openssl(
        which in 0usize..5,
        hmac in any::<bool>(),
        offload in any::<bool>(),
        key_len in 1usize..150,
        pieces in proptest::collection::vec(0usize..40000, 0..4),
        seed in any::<u64>(),
    ) {
        let _g = setup();
        set(if offload { Policy::Offload } else { Policy::Cpu }, 0);
        let names = ["sha1", "sha224", "sha256", "sha384", "sha512"];
        let md = [
            openssl::hash::MessageDigest::sha1(),
            openssl::hash::MessageDigest::sha224(),
            openssl::hash::MessageDigest::sha256(),
            openssl::hash::MessageDigest::sha384(),
            openssl::hash::MessageDigest::sha512(),
        ][which];
        let key = noise(key_len, seed ^ 9);
        let total: usize = pieces.iter().sum();
        let data = noise(total, seed);
        let reference = |data: &[u8]| if hmac {
            let k = openssl::pkey::PKey::hmac(&key).unwrap();
            let mut s = openssl::sign::Signer::new(md, &k).unwrap();
            s.update(data).unwrap();
            s.sign_to_vec().unwrap()
        } else {
            openssl::hash::hash(md, data).unwrap().to_vec()
        };
        let want = reference(&data);
        let tail = noise(3000, seed ^ 11);
        let with_tail = reference(&[&data[..], &tail[..]].concat());
        let name = if hmac { format!("hmac-{}", names[which]) } else { names[which].to_string() };
        let mut d = Digest::new(&name, if hmac { &key } else { &[] }).unwrap();
        let mut off = 0;
        for p in &pieces {
            d.update(&data[off..off + p]).unwrap();
            off += p;
        }
        // A copy (python's hashlib takes one on every digest()) goes on
        // alone, whether the message is gathered, streams on the CPU or
        // streams in a device session.
        let mut copy = d.try_clone().unwrap();
        copy.update(&tail).unwrap();
        prop_assert_eq!(copy.finish().unwrap(), with_tail);
        drop(copy);
        prop_assert_eq!(d.finish().unwrap(), want.clone());
        // The object starts over with the same key.
        d.update(&data).unwrap();
        prop_assert_eq!(d.finish().unwrap(), want);
    }
}

#[test]
fn scatter_lists_match_one_contiguous_message() {
    let _g = setup();
    for policy in [Policy::Offload, Policy::Cpu] {
        set(policy, 0);
        let key = noise(32, 5);
        let iv = noise(16, 6);
        let data = noise(100_000, 7);
        // Pieces of uneven (whole-block) sizes, one larger than a staging slot.
        let cuts = [0, 16, 4096, 4096 + 70_000, data.len()];
        let inputs: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
        let mut outs: Vec<Vec<u8>> = inputs.iter().map(|i| vec![0u8; i.len()]).collect();
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        let mut c = Cipher::new("aes-256-cbc", &key, Direction::Encrypt).unwrap();
        c.set_iv(&iv).unwrap();
        let n = c.update_sg(&inputs, &mut out_refs).unwrap();
        assert_eq!(n, data.len());
        assert_eq!(
            outs.concat(),
            reference("aes-256-cbc", &key, &iv, &data, true)
        );
    }
}

#[test]
fn xts_data_units_match_openssl() {
    let _g = setup();
    set(Policy::Offload, 0);
    for name in ["aes-128-xts", "aes-256-xts"] {
        let klen = wd_crypto::Alg::by_name(name).unwrap().key_len();
        let key = noise(klen, 77);
        let mut c = Cipher::new(name, &key, Direction::Encrypt).unwrap();
        for (unit, len) in [(0u64, 512usize), (1, 4096), (2, 17), (3, 100)] {
            let mut tweak = [0u8; 16];
            tweak[..8].copy_from_slice(&unit.to_le_bytes());
            c.set_iv(&tweak).unwrap();
            let data = noise(len, unit);
            let mut out = vec![0u8; len];
            c.update(&data, &mut out).unwrap();
            assert_eq!(
                out,
                reference(name, &key, &tweak, &data, true),
                "{name} unit {unit}"
            );
            // A data unit needs its tweak.
            assert!(c.update(&data, &mut out).is_err());
        }
    }
}

#[test]
fn hmac_with_an_empty_key() {
    let _g = setup();
    for policy in [Policy::Offload, Policy::Cpu] {
        set(policy, 0);
        let mut d = Digest::new("hmac-sha256", &[]).unwrap();
        let want = "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad";
        let got: String = d
            .finish()
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn bad_parameters_are_clear_errors() {
    let _g = setup();
    set(Policy::Offload, 0);
    let msg = |e: CryptoError| e.to_string();
    assert!(
        msg(Cipher::new("aes-128-cbc", &[0; 15], Direction::Encrypt).unwrap_err())
            .contains("16-byte key")
    );
    assert!(
        msg(Cipher::new("rot13", &[0; 16], Direction::Encrypt).unwrap_err())
            .contains("unknown cipher")
    );
    assert!(
        Cipher::new("aes-128-xts", &[7; 32], Direction::Encrypt).is_err(),
        "equal XTS halves"
    );
    let mut c = Cipher::new("aes-128-cbc", &[0; 16], Direction::Encrypt).unwrap();
    assert!(msg(c.set_iv(&[0; 8]).unwrap_err()).contains("16-byte IV"));
    let mut out = [0u8; 32];
    assert!(msg(c.update(&[0; 16], &mut out).unwrap_err()).contains("set_iv"));
    c.set_iv(&[0; 16]).unwrap();
    assert!(msg(c.update(&[0; 15], &mut out).unwrap_err()).contains("whole 16-byte blocks"));
    assert!(c.update(&[0; 32], &mut out[..16]).is_err());
    let mut a = Aead::new("aes-128-gcm", &[0; 16]).unwrap();
    let mut tag = [0u8; 3];
    assert!(a
        .seal(&[0; 12], &[], &[1, 2], &mut [0; 2], &mut tag)
        .is_err());
    assert!(Digest::new("sha256", b"key").is_err());
    assert!(Digest::new("md5", &[]).is_err());
}

#[test]
fn offloaded_and_cpu_requests_are_counted() {
    let _g = setup();
    set(Policy::Offload, 1024);
    let before = stats();
    let mut c = Cipher::new("aes-128-ctr", &[1; 16], Direction::Encrypt).unwrap();
    c.set_iv(&[0; 16]).unwrap();
    let mut out = vec![0u8; 4096];
    c.update(&[5; 100], &mut out[..100]).unwrap();
    c.update(&[5; 4096], &mut out).unwrap();
    let after = stats();
    assert_eq!(after.cpu_below_threshold - before.cpu_below_threshold, 1);
    assert!(after.offload_bytes - before.offload_bytes >= 4000);
}
