//! Random cipher streams against OpenSSL: sizes around 64 KiB, 2 MiB and
//! 4 MiB, CTR partial blocks, CBC both ways, sync and async requests mixed
//! on one stream, windows that find too few free slots (another stream's
//! jobs hold them), `update_shared`, path switches by policy and
//! threshold. `WD_TEST_SEED` and `WD_TEST_CASES` choose the cases (a
//! failing case prints its seed).

use std::sync::Mutex;

mod common;

use common::reference;
use wd_crypto::{config, Cipher, CryptoError, Direction, Job, Policy};
use wd_testutil::{noise, Rng};

static SETTINGS: Mutex<()> = Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    let g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    config::set_fallback(true);
    g
}

const K: usize = 1 << 10;
const M: usize = 1 << 20;

fn length(r: &mut Rng, ctr: bool) -> usize {
    let base = r.pick(&[64 * K, 2 * M, 4 * M, 128 * K, 16, 4096, 2 * M + 64 * K, 0]);
    let delta = r.below(97) as i64 - 48;
    let mut n = (base as i64 + delta * 16).max(16) as usize;
    if base == 0 {
        n = 1 + r.below(3 * M as u64) as usize;
    }
    if ctr {
        if r.below(2) == 0 {
            n += r.below(16) as usize;
        }
        n
    } else {
        (n / 16).max(1) * 16
    }
}

/// What a failing case prints (read through `Debug` only).
#[derive(Debug)]
#[allow(dead_code)]
struct Case {
    seed: u64,
    name: &'static str,
    enc: bool,
    log: Vec<String>,
}

fn run_case(seed: u64) -> Result<(), String> {
    let mut r = Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let (name, enc) = r.pick(&[
        ("aes-128-cbc", true),
        ("aes-128-cbc", false),
        ("aes-256-cbc", true),
        ("aes-128-ctr", true),
        ("aes-128-ctr", false),
        ("aes-128-ecb", true),
    ]);
    let mut case = Case {
        seed,
        name,
        enc,
        log: Vec::new(),
    };
    let policy = r.pick(&[Policy::Offload, Policy::Offload, Policy::Auto, Policy::Cpu]);
    let threshold = r.pick(&[0usize, 256, 70_000]);
    config::set_policy(policy);
    config::set_threshold(threshold);
    config::set_in_place(r.below(3) == 0);
    case.log.push(format!("{policy:?} threshold {threshold}"));
    let ctr = name.ends_with("ctr");
    let key = noise(if name.contains("256") { 32 } else { 16 }, seed ^ 5);
    let iv = noise(16, seed ^ 6);
    let ivo = (!name.ends_with("ecb")).then_some(&iv[..]);

    // Another stream's jobs hold some slots of this thread's lane.
    let fill_slots = r.pick(&[0usize, 0, 20, 33, 40, 56, 63]);
    let mut filler = Cipher::new("aes-128-ecb", &key[..16], Direction::Encrypt).unwrap();
    let fill_in = noise(64 * K, 7);
    let mut fill_out: Vec<Vec<u8>> = (0..fill_slots).map(|_| vec![0u8; 64 * K]).collect();
    let mut fill_jobs = Vec::new();
    for o in fill_out.iter_mut() {
        fill_jobs.push(filler.start_offload(&fill_in, o).unwrap());
    }
    case.log.push(format!("filler holds {fill_slots} slots"));

    let ops = 2 + r.below(5) as usize;
    let lens: Vec<usize> = (0..ops).map(|_| length(&mut r, ctr)).collect();
    let total: usize = lens.iter().sum();
    let data = noise(total, seed ^ 8);
    let want = reference(name, &key, ivo.unwrap_or(&[]), &data, enc);
    let dir = if enc {
        Direction::Encrypt
    } else {
        Direction::Decrypt
    };
    let mut c = Cipher::new(name, &key, dir).unwrap();
    if ivo.is_some() {
        c.set_iv(&iv).unwrap();
    }
    let mut out = vec![0u8; total];
    let src = wrapdrive::SharedBuf::new(total).unwrap();
    let dst = wrapdrive::SharedBuf::new(total).unwrap();
    src.write(0, &data);
    let (ss, ds) = (
        wrapdrive::SharedSpan::of(&src),
        wrapdrive::SharedSpan::of(&dst),
    );
    let mut shared_ranges = Vec::new();
    // Jobs of this stream in flight: (job, offset, len).
    let mut pending: Vec<(Job, usize, usize)> = Vec::new();
    let mut off = 0;
    for &l in &lens {
        let kind = r.below(6);
        case.log.push(format!(
            "op {kind} len {l} at {off} (pending {})",
            pending.len()
        ));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let res: Result<(), CryptoError> = match kind {
                0 => c
                    .update(&data[off..off + l], &mut out[off..off + l])
                    .map(|_| ()),
                1 => c
                    .update_offload(&data[off..off + l], &mut out[off..off + l])
                    .map(|_| ()),
                2 | 3 => {
                    let j = if kind == 2 {
                        c.start(&data[off..off + l], &mut out[off..off + l])
                    } else {
                        c.start_offload(&data[off..off + l], &mut out[off..off + l])
                    };
                    j.map(|j| {
                        if !j.is_done() {
                            pending.push((j, off, l));
                        }
                    })
                }
                4 => {
                    let j = c.start_offload(&data[off..off + l], &mut out[off..off + l]);
                    j.and_then(|j| c.finish(j, &mut out[off..off + l]).map(|_| ()))
                }
                _ => {
                    let rr =
                        c.update_shared(ss.sub(off as u64, l as u64), ds.sub(off as u64, l as u64));
                    if rr.is_ok() {
                        shared_ranges.push((off, l));
                    }
                    rr.map(|_| ())
                }
            };
            match res {
                Ok(()) => break,
                Err(CryptoError::Busy) if attempt < 3 => {
                    case.log.push(format!("Busy (pending {})", pending.len()));
                    if pending.is_empty() {
                        // The filler holds the slots (documented Busy for
                        // a start): the caller waits instead.
                        c.update_offload(&data[off..off + l], &mut out[off..off + l])
                            .map_err(|e| format!("{case:?}: sync after Busy: {e:?}"))?;
                        break;
                    }
                    // Finish this stream's jobs, then send it again.
                    for (j, o, n) in pending.drain(..) {
                        c.finish(j, &mut out[o..o + n])
                            .map_err(|e| format!("{case:?}: finish: {e:?}"))?;
                    }
                }
                Err(e) => {
                    for (j, o, n) in pending.drain(..) {
                        let _ = c.finish(j, &mut out[o..o + n]);
                    }
                    for (j, o) in fill_jobs.into_iter().zip(fill_out.iter_mut()) {
                        let _ = filler.finish(j, o);
                    }
                    return Err(format!("{case:?}: error {e:?}"));
                }
            }
        }
        // Now and then finish what is in flight.
        if r.below(3) == 0 {
            for (j, o, n) in pending.drain(..) {
                c.finish(j, &mut out[o..o + n])
                    .map_err(|e| format!("{case:?}: finish: {e:?}"))?;
            }
        }
        off += l;
    }
    for (j, o, n) in pending.drain(..) {
        c.finish(j, &mut out[o..o + n])
            .map_err(|e| format!("{case:?}: finish: {e:?}"))?;
    }
    for (j, o) in fill_jobs.into_iter().zip(fill_out.iter_mut()) {
        filler.finish(j, o).unwrap();
    }
    for (o, n) in shared_ranges {
        ds.read(o as u64, &mut out[o..o + n]);
    }
    if let Some(bad) = out.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(format!(
            "{case:?}: output differs from OpenSSL at byte {bad} of {total}"
        ));
    }
    Ok(())
}

#[test]
fn random_streams_match_openssl() {
    let _g = setup();
    let first: u64 = std::env::var("WD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let count: u64 = std::env::var("WD_TEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let mut failures = Vec::new();
    for seed in first..first + count {
        if let Err(e) = run_case(seed) {
            eprintln!("FAIL {e}");
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing cases; first: {}",
        failures.len(),
        failures[0]
    );
}
