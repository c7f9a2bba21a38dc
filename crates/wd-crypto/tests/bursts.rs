//! Many CBC encryptions in flight at once through an embedded host, so the
//! sec device gathers them into multi-buffer bursts (when intel-ipsec-mb
//! is installed; libcrypto otherwise, which the same test then checks):
//! several streams of every key size, each continued over several
//! requests, submitted interleaved without waiting, against OpenSSL.

use openssl::symm::{Cipher as OCipher, Crypter, Mode as OMode};
use wd_crypto::{Cipher, Direction};

fn reference(name: &str, key: &[u8], iv: &[u8], data: &[u8]) -> Vec<u8> {
    let c = match name {
        "aes-128-cbc" => OCipher::aes_128_cbc(),
        "aes-192-cbc" => OCipher::aes_192_cbc(),
        _ => OCipher::aes_256_cbc(),
    };
    let mut cr = Crypter::new(c, OMode::Encrypt, key, Some(iv)).unwrap();
    cr.pad(false);
    let mut out = vec![0u8; data.len() + 16];
    let n = cr.update(data, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn interleaved_streams_in_flight_match_openssl() {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    const STREAMS: usize = 24;
    const PARTS: usize = 6;
    let names = ["aes-128-cbc", "aes-192-cbc", "aes-256-cbc"];
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let name = names[s % 3];
        let key: Vec<u8> = (0..32 - 8 * (2 - s % 3))
            .map(|i| (i * 7 + s * 13) as u8)
            .collect();
        let iv: Vec<u8> = (0..16).map(|i| (i * 3 + s) as u8).collect();
        let mut c = Cipher::new(name, &key, Direction::Encrypt).unwrap();
        c.set_iv(&iv).unwrap();
        // Parts of different lengths (whole blocks), 16 B to 16 KiB.
        let parts: Vec<Vec<u8>> = (0..PARTS)
            .map(|p| {
                let len = 16 << ((s + p) % 11);
                (0..len).map(|i| (i ^ (s * 31 + p)) as u8).collect()
            })
            .collect();
        streams.push((name, key, iv, c, parts));
    }
    let mut outs: Vec<Vec<Vec<u8>>> = streams
        .iter()
        .map(|(.., parts)| parts.iter().map(|p| vec![0u8; p.len()]).collect())
        .collect();
    // Round p: every stream's part p starts before any finishes, so the
    // device sees many sessions' requests at once.
    for p in 0..PARTS {
        let mut jobs = Vec::new();
        for (s, (_, _, _, c, parts)) in streams.iter_mut().enumerate() {
            jobs.push(c.start_offload(&parts[p], &mut outs[s][p]).unwrap());
        }
        for ((s, (_, _, _, c, _)), job) in streams.iter_mut().enumerate().zip(jobs) {
            c.finish(job, &mut outs[s][p]).unwrap();
        }
    }
    for (s, (name, key, iv, _, parts)) in streams.iter().enumerate() {
        let plain: Vec<u8> = parts.concat();
        let got: Vec<u8> = outs[s].concat();
        assert_eq!(got, reference(name, key, iv, &plain), "stream {s} ({name})");
    }
}
