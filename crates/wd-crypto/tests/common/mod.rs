//! OpenSSL's default provider (the `openssl` crate) as the reference the
//! cipher tests compare with.

use openssl::nid::Nid;
use openssl::symm::{Cipher, Crypter, Mode};

/// OpenSSL's cipher of the library's name.
pub fn ocipher(name: &str) -> Cipher {
    Cipher::from_nid(match name {
        "aes-128-ecb" => Nid::AES_128_ECB,
        "aes-192-cbc" => Nid::AES_192_CBC,
        "aes-128-cbc" => Nid::AES_128_CBC,
        "aes-256-cbc" => Nid::AES_256_CBC,
        "aes-128-ctr" => Nid::AES_128_CTR,
        "aes-256-ctr" => Nid::AES_256_CTR,
        "aes-128-xts" => Nid::AES_128_XTS,
        "aes-256-xts" => Nid::AES_256_XTS,
        "aes-128-gcm" => Nid::AES_128_GCM,
        "aes-256-gcm" => Nid::AES_256_GCM,
        n => panic!("{n}"),
    })
    .unwrap()
}

/// `data` through OpenSSL's `name` without padding (`iv` empty: none).
pub fn reference(name: &str, key: &[u8], iv: &[u8], data: &[u8], encrypt: bool) -> Vec<u8> {
    let iv = (!iv.is_empty()).then_some(iv);
    let mode = if encrypt {
        Mode::Encrypt
    } else {
        Mode::Decrypt
    };
    let mut c = Crypter::new(ocipher(name), mode, key, iv).unwrap();
    c.pad(false);
    let mut out = vec![0u8; data.len() + 32];
    let n = c.update(data, &mut out).unwrap();
    let m = c.finalize(&mut out[n..]).unwrap();
    out.truncate(n + m);
    out
}
