//! The multi-buffer engine against OpenSSL's default provider: random
//! keys of every size, IVs, lengths and batch make-ups, in place and out
//! of place, messages continued across bursts. Skipped (and counted) where
//! intel-ipsec-mb is not installed.

use openssl::symm::{encrypt, Cipher};
use proptest::prelude::*;
use wd_ipsecmb::{CbcJob, Engine, MbError};
use wd_sys::devmem::DeviceSlice;

fn engine(test: &str) -> Option<&'static Engine> {
    match Engine::get() {
        Ok(e) => Some(e),
        Err(e @ MbError::NotInstalled(_)) => {
            wd_testutil::skip(test, &e.to_string());
            None
        }
        Err(e) => panic!("intel-ipsec-mb is installed but unusable: {e}"),
    }
}

fn reference(key: &[u8], iv: &[u8; 16], data: &[u8]) -> Vec<u8> {
    let c = match key.len() {
        16 => Cipher::aes_128_cbc(),
        24 => Cipher::aes_192_cbc(),
        _ => Cipher::aes_256_cbc(),
    };
    let mut cr =
        openssl::symm::Crypter::new(c, openssl::symm::Mode::Encrypt, key, Some(iv)).unwrap();
    cr.pad(false);
    let mut out = vec![0u8; data.len() + 16];
    let n = cr.update(data, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn names_the_code_path_it_chose() {
    let Some(e) = engine("names_the_code_path_it_chose") else {
        return;
    };
    assert!(e.name().starts_with("ipsec-mb/"), "{}", e.name());
    assert!(e.version().starts_with("1."), "{}", e.version());
}

#[test]
fn refuses_bad_keys_and_lengths() {
    let Some(e) = engine("refuses_bad_keys_and_lengths") else {
        return;
    };
    assert_eq!(e.schedule(&[0u8; 20]).unwrap_err(), MbError::KeyLength(20));
    let k = e.schedule(&[0u8; 16]).unwrap();
    let mut a = [0u8; 24];
    let mut b = [0u8; 32];
    let s = DeviceSlice::from_mut(&mut a);
    let d = DeviceSlice::from_mut(&mut b);
    assert!(matches!(
        CbcJob::new(&k, [0; 16], s, d),
        Err(MbError::Length { len: 24, .. })
    ));
    let s = DeviceSlice::from_mut(&mut b);
    let d = DeviceSlice::from_mut(&mut a);
    assert!(matches!(
        CbcJob::new(&k, [0; 16], s, d),
        Err(MbError::Length { len: 32, room: 24 })
    ));
    // The one-shot helper of the openssl crate pads; the engine never does.
    assert_eq!(
        encrypt(Cipher::aes_128_cbc(), &[0; 16], Some(&[0; 16]), &[])
            .unwrap()
            .len(),
        16
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn bursts_match_openssl(
        msgs in prop::collection::vec(
            (prop::sample::select(vec![16usize, 24, 32]), any::<[u8; 32]>(), any::<[u8; 16]>(),
             prop::collection::vec(0usize..40, 1..4), any::<bool>(), any::<u64>()),
            1..40)
    ) {
        let Some(e) = engine("bursts_match_openssl") else { return Ok(()) };
        // Each message is cut into parts (in blocks); part k of every
        // message goes in burst k, continuing from the IV the last burst left.
        struct Msg { key: Vec<u8>, iv: [u8; 16], plain: Vec<u8>, cuts: Vec<usize>, inplace: bool, out: Vec<u8> }
        let mut all: Vec<Msg> = msgs.iter().map(|(kl, k, iv, parts, inplace, seed)| {
            let total: usize = parts.iter().sum::<usize>() * 16;
            let plain: Vec<u8> = (0..total).map(|i| (seed.wrapping_mul(i as u64 + 7) >> 13) as u8).collect();
            Msg { key: k[..*kl].to_vec(), iv: *iv, plain, cuts: parts.iter().map(|p| p * 16).collect(), inplace: *inplace, out: Vec::new() }
        }).collect();
        let schedules: Vec<_> = all.iter().map(|m| e.schedule(&m.key).unwrap()).collect();
        let mut ivs: Vec<[u8; 16]> = all.iter().map(|m| m.iv).collect();
        let mut offs = vec![0usize; all.len()];
        for round in 0..4 {
            let mut bufs: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
            for (i, m) in all.iter().enumerate() {
                if let Some(&n) = m.cuts.get(round) {
                    let part = m.plain[offs[i]..offs[i] + n].to_vec();
                    bufs.push((i, part, vec![0u8; n + (i % 3) * 16]));
                }
            }
            let mut jobs = Vec::new();
            for (i, src, dst) in bufs.iter_mut() {
                let s = DeviceSlice::from_mut(src);
                let d = if all[*i].inplace { s } else { DeviceSlice::from_mut(dst) };
                jobs.push(CbcJob::new(&schedules[*i], ivs[*i], s, d).unwrap());
            }
            e.cbc_encrypt(&mut jobs).unwrap();
            let next: Vec<[u8; 16]> = jobs.iter().map(|j| j.iv).collect();
            drop(jobs);
            for (k, (i, src, dst)) in bufs.iter().enumerate() {
                let n = src.len();
                let out = if all[*i].inplace { &src[..] } else { &dst[..n] };
                all[*i].out.extend_from_slice(out);
                if n > 0 { ivs[*i] = next[k]; }
                offs[*i] += n;
            }
        }
        for m in &all {
            prop_assert_eq!(&m.out, &reference(&m.key, &m.iv, &m.plain));
        }
    }
}
