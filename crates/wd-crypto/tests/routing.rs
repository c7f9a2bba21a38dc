//! The auto policy measures every operation on both paths before it
//! chooses: AEAD messages and long digest streams included (they were
//! never timed: a GCM message went by a cipher's costs, a digest longer
//! than a staging slot stayed on the CPU for good), each apart from the
//! others.

use wd_crypto::route::{self, Op};
use wd_crypto::{config, Aead, Digest, Direction, Policy};
use wd_testutil::noise;

#[test]
fn aead_messages_and_long_digests_are_measured_on_both_paths() {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    config::set_policy(Policy::Auto);
    config::set_threshold(0);
    config::set_fallback(true);
    let key = noise(16, 1);
    let pt = noise(16 << 10, 2);
    let (mut ct, mut back, mut tag) = (vec![0u8; pt.len()], vec![0u8; pt.len()], [0u8; 16]);
    let mut a = Aead::new("aes-128-gcm", &key).unwrap();
    for i in 0..4u8 {
        let iv = noise(12, 10 + u64::from(i));
        a.seal(&iv, b"aad", &pt, &mut ct, &mut tag).unwrap();
        a.begin(Direction::Decrypt, &iv).unwrap();
        a.aad(b"aad").unwrap();
        a.update(&ct, &mut back).unwrap();
        a.finish_open(&tag).unwrap();
        assert_eq!(back, pt);
    }
    let (cpu, dev) = route::estimate(Op::Aead, pt.len());
    assert!(cpu.is_some() && dev.is_some(), "AEAD costs {cpu:?} {dev:?}");
    assert_eq!(
        route::estimate(Op::Cipher, pt.len()),
        (None, None),
        "AEAD messages are not a cipher's samples"
    );
    let data = noise(256 << 10, 3);
    let want = openssl::hash::hash(openssl::hash::MessageDigest::sha256(), &data).unwrap();
    for _ in 0..4 {
        let mut d = Digest::new("sha256", &[]).unwrap();
        d.update(&data).unwrap();
        assert_eq!(d.finish().unwrap(), want.to_vec());
    }
    let (cpu, dev) = route::estimate(Op::Digest, data.len());
    assert!(
        cpu.is_some() && dev.is_some(),
        "long digest costs {cpu:?} {dev:?}"
    );
}
