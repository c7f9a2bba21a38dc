//! The safe `CipherCtx` API must not let libcrypto read or write
//! outside the slices it is given.
use wd_evp::CipherCtx;
use wd_sec_msg::Alg;

/// A CBC update of a partial block leaves it buffered in the context; the
/// next update then writes a whole block, more than `src.len()` bytes,
/// past the end of `dst` (safe code, out-of-bounds write).
#[test]
fn a_cbc_update_never_writes_past_its_output() {
    let mut c = CipherCtx::new(Alg::by_name("aes-128-cbc").unwrap()).unwrap();
    c.init(Some(&[1; 16]), Some(&[2; 16]), true).unwrap();
    let mut first = [0u8; 24];
    // Refused or not, it must not leave state that overruns the next call.
    let _ = c.update(&mut first, &[3; 24]);
    let mut out = [0xAAu8; 32];
    let _ = c.update(&mut out[..8], &[4; 8]);
    assert_eq!(
        out[8..],
        [0xAA; 24],
        "libcrypto wrote past the 8-byte output slice"
    );
}

/// A key shorter than the cipher's is read past its end by libcrypto
/// (`init` is safe; its SAFETY comment leans on the caller's checks).
#[test]
fn a_short_key_or_iv_is_refused() {
    let mut c = CipherCtx::new(Alg::by_name("aes-256-cbc").unwrap()).unwrap();
    assert!(
        c.init(Some(&[1; 16]), Some(&[2; 16]), true).is_err(),
        "16-byte key for AES-256"
    );
    let mut c = CipherCtx::new(Alg::by_name("aes-128-cbc").unwrap()).unwrap();
    assert!(
        c.init(Some(&[1; 16]), Some(&[2; 4]), true).is_err(),
        "4-byte IV for CBC"
    );
}
