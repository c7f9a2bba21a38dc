//! Cipher and AEAD sessions at the edges of the staging area and of their
//! lanes, against OpenSSL (embedded host): XTS units longer than a slot,
//! requests longer than the staging area or than its free slots, jobs
//! finished out of order, CTR streams moving to another lane, additional
//! data that fills a slot, a message moved to another thread.

use std::sync::Mutex;

mod common;

use common::{ocipher, reference};
use wd_crypto::{config, Aead, Cipher, CryptoError, Direction, Policy};
use wd_testutil::noise;

/// A synchronous request's window (half the 64 slots of 64 KiB).
const MIB2: usize = 2 << 20;

static SETTINGS: Mutex<()> = Mutex::new(());

fn setup(policy: Policy, threshold: usize) -> std::sync::MutexGuard<'static, ()> {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    let g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    config::set_policy(policy);
    config::set_threshold(threshold);
    config::set_fallback(true);
    g
}

/// Another stream's jobs holding `slots` of this thread's 64 staging
/// slots, and all of its large staging areas (two of 32 units of 1 MiB,
/// where a job longer than a slot goes first), until `release`.
struct Held {
    c: Cipher,
    jobs: Vec<(wd_crypto::Job, Vec<u8>)>,
}

fn hold_slots(slots: usize) -> Held {
    let mut c = Cipher::new("aes-128-ecb", &[0x77; 16], Direction::Encrypt).unwrap();
    let mut hold = |len: usize| {
        let fill = noise(len, 0x77);
        let mut out = vec![0u8; len];
        let j = c.start_offload(&fill, &mut out).unwrap();
        assert!(!j.is_done(), "a job holding staging went to the CPU");
        (j, out)
    };
    let mut jobs: Vec<_> = (0..8).map(|_| hold(8 << 20)).collect();
    jobs.extend((0..slots).map(|_| hold(64 << 10)));
    Held { c, jobs }
}

impl Held {
    fn release(mut self) {
        for (j, mut out) in std::mem::take(&mut self.jobs) {
            self.c.finish(j, &mut out).unwrap();
        }
    }
}

/// An XTS data unit longer than one staging slot (64 KiB) is cut into
/// slot-sized requests, each sent with F_IV and the same tweak: every
/// piece after the first is encrypted as a new data unit.
#[test]
fn xts_unit_longer_than_a_slot_matches_openssl() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(32, 1);
    let tweak = noise(16, 2);
    for len in [100_000usize, 65536 + 16] {
        let data = noise(len, 3);
        let mut c = Cipher::new("aes-128-xts", &key, Direction::Encrypt).unwrap();
        c.set_iv(&tweak).unwrap();
        let mut out = vec![0u8; len];
        let r = c.update(&data, &mut out);
        let want = reference("aes-128-xts", &key, &tweak, &data, true);
        assert!(r.is_ok(), "len {len}: {r:?}");
        let first_bad = out.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first_bad, None,
            "len {len}: XTS output differs from OpenSSL"
        );
    }
}

/// CBC encryption: two async jobs finished in the opposite order leave
/// the tracked IV at the first job's last block; the next request that
/// runs on the CPU (below the threshold) starts from that stale IV.
#[test]
fn cbc_jobs_finished_out_of_order_then_cpu_request() {
    let _g = setup(Policy::Offload, 256);
    let key = noise(16, 11);
    let iv = noise(16, 12);
    let data = noise(4096 * 2 + 32, 13);
    let want = reference("aes-128-cbc", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    let (o1, rest) = out.split_at_mut(4096);
    let (o2, o3) = rest.split_at_mut(4096);
    let j1 = c.start(&data[..4096], o1).unwrap();
    let j2 = c.start(&data[4096..8192], o2).unwrap();
    assert!(!j1.is_done() && !j2.is_done(), "both on the device");
    c.finish(j2, o2).unwrap();
    c.finish(j1, o1).unwrap();
    // 32 bytes: below the threshold, on the CPU.
    c.update(&data[8192..], o3).unwrap();
    assert_eq!(&out[..8192], &want[..8192], "device part");
    assert_eq!(
        &out[8192..],
        &want[8192..],
        "CPU part after out-of-order finish"
    );
}

/// CTR: a device request that ends inside a keystream block, then the
/// stream continued on another lane (here: the session moved to another
/// thread; the same happens after a lane is re-made on a restarted host):
/// `ctr_head` skips the CPU head because the chain is "on a device", but
/// the new lane starts with F_IV at the block boundary, ignoring the bytes
/// already used of that block.
#[test]
fn ctr_partial_block_continued_on_another_lane() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 21);
    let iv = noise(16, 22);
    let data = noise(100 + 4000, 23);
    let want = reference("aes-128-ctr", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    c.update(&data[..100], &mut out[..100]).unwrap();
    let (data2, out2) = (&data[100..], &mut out[100..]);
    std::thread::scope(|s| {
        s.spawn(|| {
            c.update(data2, out2).unwrap();
        });
    });
    assert_eq!(&out[..100], &want[..100]);
    let first_bad = out.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "CTR continued on another lane differs");
}

/// A synchronous update longer than the lane's 64 staging slots (4 MiB)
/// fails with Busy after sending 64 pieces, whose slots are never given
/// back: the thread's lane is dead for every later device request.
#[test]
fn update_longer_than_the_staging_area() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 31);
    let iv = noise(16, 32);
    let data = noise(5 << 20, 33);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    let r = c.update(&data, &mut out);
    let big = match &r {
        Ok(_) => None,
        Err(e) => Some(format!("{e:?}")),
    };
    // Whatever happened above, a small request of another session on this
    // thread must work.
    let mut d = Cipher::new("aes-128-ecb", &key, Direction::Encrypt).unwrap();
    let small = noise(4096, 34);
    let mut o = vec![0u8; 4096];
    let r2 = d.update(&small, &mut o).map_err(|e| format!("{e:?}"));
    assert_eq!(
        (big, r2),
        (None, Ok(4096)),
        "5 MiB update, then a 4 KiB request of another session on the same thread"
    );
    assert_eq!(out, reference("aes-128-ctr", &key, &iv, &data, true));
}

/// A start that runs out of slots half way returns Busy, but the pieces it
/// already sent stay on the device (slots leaked, session chain and
/// tracked IV advanced): retrying the same data then succeeds with the
/// wrong output.
#[test]
fn busy_half_way_then_retry_gives_wrong_output() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 41);
    let iv = noise(16, 42);
    let held = hold_slots(60);
    // 8 slots needed, 4 free.
    let data = noise(8 * (64 << 10), 44);
    let mut out = vec![0u8; data.len()];
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let e = c.start_offload(&data, &mut out).unwrap_err();
    assert!(matches!(e, CryptoError::Busy), "{e:?}");
    held.release();
    // The caller retries the same request (EAGAIN).
    let r = c.update(&data, &mut out).map_err(|e| format!("{e:?}"));
    let want = reference("aes-128-ctr", &key, &iv, &data, true);
    let ok = out == want;
    assert!(
        r.is_err() || ok,
        "retry after Busy succeeded with wrong output"
    );
    assert!(r.is_ok() && ok, "retry after Busy: {r:?}");
}

/// GCM with additional data near MAX_AAD (64 KiB, accepted by `aad`): the
/// streaming update computes `SLOT - 16 - aad.len()` and underflows.
#[test]
fn gcm_with_large_aad_and_data() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 51);
    let iv = noise(12, 52);
    let aad = noise(65530, 53);
    let pt = noise(64, 54);
    let mut a = Aead::new("aes-128-gcm", &key).unwrap();
    let mut ct = vec![0u8; pt.len()];
    let mut tag = [0u8; 16];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.seal(&iv, &aad, &pt, &mut ct, &mut tag)
    }));
    match r {
        Err(p) => panic!(
            "seal panicked: {:?}",
            p.downcast_ref::<String>()
                .cloned()
                .or(p.downcast_ref::<&str>().map(|s| s.to_string()))
        ),
        Ok(r) => {
            r.unwrap();
        }
    }
    let want = openssl::symm::encrypt_aead(
        ocipher("aes-128-gcm"),
        &key,
        Some(&iv),
        &aad,
        &pt,
        &mut [0u8; 16],
    )
    .unwrap();
    assert_eq!(ct, want);
}

/// GMAC (no data) with additional data that fills the slot: the tag is
/// placed after the AAD, past the end of the request's slot, in the next
/// slot, which another request of the thread owns: that request's output
/// is overwritten and it completes with success.
#[test]
fn gmac_tag_written_into_another_requests_slot() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 61);
    let ekey = noise(16, 62);
    let mut ecb = Cipher::new("aes-128-ecb", &ekey, Direction::Encrypt).unwrap();
    let a_in = noise(4096, 63);
    let b_in = noise(4096, 64);
    let mut a_out = vec![0u8; 4096];
    let mut b_out = vec![0u8; 4096];
    let ja = ecb.start_offload(&a_in, &mut a_out).unwrap();
    let jb = ecb.start_offload(&b_in, &mut b_out).unwrap();
    assert!(!ja.is_done() && !jb.is_done());
    ecb.finish(ja, &mut a_out).unwrap();
    // A's slot is free again; B's (the next one) still holds B's result.
    let mut g = Aead::new("aes-128-gcm", &key).unwrap();
    let aad = noise(65530, 65);
    g.begin(Direction::Encrypt, &noise(12, 66)).unwrap();
    g.aad(&aad).unwrap();
    let mut tag = [0u8; 16];
    g.finish_seal(&mut tag).unwrap();
    ecb.finish(jb, &mut b_out).unwrap();
    let want_b = reference("aes-128-ecb", &ekey, &[], &b_in, true);
    let bad: Vec<usize> = (0..4096).filter(|&i| b_out[i] != want_b[i]).collect();
    assert!(
        bad.is_empty(),
        "B's output differs at {bad:?}; B's first bytes {:02x?}, the GMAC tag {:02x?}",
        &b_out[..10],
        &tag[6..]
    );
    let mut otag = [0u8; 16];
    openssl::symm::encrypt_aead(
        ocipher("aes-128-gcm"),
        &key,
        Some(&noise(12, 66)),
        &aad,
        &[],
        &mut otag,
    )
    .unwrap();
    assert_eq!(tag, otag);
}

/// A GCM message begun on one thread and continued on another is an error
/// for that call, and the other thread's own requests go on: its queue is
/// not taken for a host that went away.
#[test]
fn a_message_continued_on_another_thread() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 71);
    let mut a = Aead::new("aes-128-gcm", &key).unwrap();
    let mut ct = vec![0u8; 64];
    std::thread::scope(|s| {
        s.spawn(|| {
            a.begin(Direction::Encrypt, &noise(12, 72)).unwrap();
            a.update(&noise(64, 73), &mut ct).unwrap();
        });
    });
    let ekey = noise(16, 74);
    let mut ecb = Cipher::new("aes-128-ecb", &ekey, Direction::Encrypt).unwrap();
    let input = noise(4096, 75);
    let mut out = vec![0u8; 4096];
    let job = ecb.start_offload(&input, &mut out).unwrap();
    assert!(!job.is_done());
    let e = a.update(&noise(64, 76), &mut ct).unwrap_err();
    assert!(e.to_string().contains("another thread"), "{e}");
    ecb.finish(job, &mut out).unwrap();
    assert_eq!(out, reference("aes-128-ecb", &ekey, &[], &input, true));
}

/// CBC encryption with jobs of the stream in flight: a start refused with
/// Busy (no free slot) runs `restore(saved)`, which sets the chain to
/// Fresh and the IV to the tracked one, which for CBC encryption is still
/// the IV from before the jobs in flight (it is learnt at completion).
/// The jobs then finish without updating the IV (chain no longer on the
/// device), and the retry the docs call right encrypts with the old IV.
#[test]
fn cbc_encrypt_busy_start_with_jobs_in_flight_then_retry() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 1);
    let iv = noise(16, 2);
    let data = noise(2 * MIB2 + 4096, 3);
    let want = reference("aes-128-cbc", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    let (o1, rest) = out.split_at_mut(MIB2);
    let (o2, o3) = rest.split_at_mut(MIB2);
    // The large staging area taken, 32 slots each: the lane's 64 are all
    // taken.
    let held = hold_slots(0);
    let j1 = c.start_offload(&data[..MIB2], o1).unwrap();
    let j2 = c.start_offload(&data[MIB2..2 * MIB2], o2).unwrap();
    assert!(!j1.is_done() && !j2.is_done());
    let e = c.start_offload(&data[2 * MIB2..], o3).unwrap_err();
    assert!(matches!(e, CryptoError::Busy), "{e:?}");
    c.finish(j1, o1).unwrap();
    c.finish(j2, o2).unwrap();
    held.release();
    // Sending it again is right (docs/sec-device.md, Bounds).
    let j3 = c.start_offload(&data[2 * MIB2..], o3).unwrap();
    if !j3.is_done() {
        c.finish(j3, o3).unwrap();
    }
    let first_bad = out.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        first_bad,
        None,
        "retry after Busy: CBC output differs from OpenSSL (the retry starts at {})",
        2 * MIB2
    );
}

/// update_shared (in place, <= 2 MiB) while this thread's jobs of another
/// stream hold every slot: a synchronous request should run on the CPU
/// (docs: "a window that finds too few slots free is computed on the
/// CPU"), the stream having nothing in flight; the direct path propagates
/// Busy with `?`.
#[test]
fn update_shared_busy_while_other_jobs_hold_the_slots() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 11);
    let held = hold_slots(64);

    let iv = noise(16, 13);
    let n = 128 << 10;
    let data = noise(n, 14);
    let src = wrapdrive::SharedBuf::new(n).unwrap();
    let dst = wrapdrive::SharedBuf::new(n).unwrap();
    src.write(0, &data);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    // The same request given as slices runs on the CPU:
    let mut o = vec![0u8; n];
    let mut c2 = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c2.set_iv(&iv).unwrap();
    let r_slices = c2.update(&data, &mut o).map_err(|e| format!("{e:?}"));
    let r_shared = c
        .update_shared(
            wrapdrive::SharedSpan::of(&src),
            wrapdrive::SharedSpan::of(&dst),
        )
        .map_err(|e| format!("{e:?}"));
    held.release();
    assert_eq!(r_slices, Ok(n), "slices");
    assert_eq!(r_shared, Ok(n), "update_shared while the slots are taken");
    assert_eq!(
        dst.to_vec(),
        reference("aes-128-ctr", &key, &iv, &data, true)
    );
}

/// A CBC encryption stream whose job is in flight on thread A, continued
/// (sync) on thread B (C callers may hand a session to another thread):
/// the docs say continuing a message under way elsewhere fails with
/// BadState; B's lane instead starts it with F_IV and the tracked IV,
/// which for CBC encryption is the IV from before A's job: wrong output,
/// success.
#[test]
fn cbc_stream_with_job_in_flight_continued_on_another_thread() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 21);
    let iv = noise(16, 22);
    let data = noise(3 * 4096, 23);
    let want = reference("aes-128-cbc", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    let (o1, rest) = out.split_at_mut(4096);
    let (o2, o3) = rest.split_at_mut(4096);
    let j1 = c.start_offload(&data[..4096], o1).unwrap();
    assert!(!j1.is_done());
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            c.update_offload(&data[4096..8192], o2)
                .map_err(|e| format!("{e:?}"))
        })
        .join()
        .unwrap()
    });
    c.finish(j1, o1).unwrap();
    let _ = o3;
    assert_eq!(&out[..4096], &want[..4096]);
    assert!(
        r.is_err() || out[4096..8192] == want[4096..8192],
        "continued on thread B: {r:?}, success with output that differs from OpenSSL"
    );
}

/// update_sg: one message in more pieces than the lane has slots. Each
/// piece is a start; the 65th is refused with Busy after 64 were sent, and
/// update_sg returns Busy with 64 pieces computed and the stream moved:
/// not "whole or not at all".
#[test]
fn update_sg_more_pieces_than_slots() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 41);
    let iv = noise(16, 42);
    let piece = 1024;
    let data = noise(65 * piece, 43);
    let want = reference("aes-128-ctr", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    let inputs: Vec<&[u8]> = data.chunks(piece).collect();
    let mut outputs: Vec<&mut [u8]> = out.chunks_mut(piece).collect();
    let r = c
        .update_sg(&inputs, &mut outputs)
        .map_err(|e| format!("{e:?}"));
    assert_eq!(r, Ok(data.len()), "update_sg of 65 pieces");
    assert_eq!(out, want);
}

/// A synchronous CTR request over 2 MiB on a stream that is inside a
/// keystream block: its first window finds too few free slots and runs on
/// the CPU, the next goes to the device with F_IV at the block boundary,
/// ignoring the bytes used of the block (`ctr_head` runs once per
/// request, before the first window only). Wrong output, success.
#[test]
fn ctr_window_on_cpu_then_device_inside_a_block() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 51);
    let iv = noise(16, 52);
    // 40 slots held: 24 free, a 2 MiB window needs 32.
    let held = hold_slots(40);
    let data = noise(100 + MIB2 + 4096, 54);
    let want = reference("aes-128-ctr", &key, &iv, &data, true);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut out = vec![0u8; data.len()];
    c.update_offload(&data[..100], &mut out[..100]).unwrap();
    let r = c.update_offload(&data[100..], &mut out[100..]);
    held.release();
    assert!(r.is_ok(), "{r:?}");
    let first_bad = out.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        first_bad,
        None,
        "CTR: second window (from byte {}) differs from OpenSSL",
        100 + MIB2
    );
}

/// AEAD one-shot (synchronous) while this thread's cipher jobs hold every
/// slot: Busy, where the bounds of the staging area say a synchronous
/// request that finds no free slot runs on the CPU.
#[test]
fn aead_seal_busy_while_jobs_hold_the_slots() {
    let _g = setup(Policy::Offload, 0);
    let key = noise(16, 61);
    let held = hold_slots(64);
    let mut a = wd_crypto::Aead::new("aes-128-gcm", &key).unwrap();
    let pt = noise(4096, 63);
    let mut ct = vec![0u8; 4096];
    let mut tag = [0u8; 16];
    let r = a
        .seal(&noise(12, 64), b"aad", &pt, &mut ct, &mut tag)
        .map_err(|e| format!("{e:?}"));
    held.release();
    assert_eq!(r, Ok(()), "AEAD seal while the slots are taken");
}

/// A digest streaming on the device finished on another thread is refused
/// and kept: finished on its own thread it gives the whole message's
/// digest (the refused finish used to start the object over, dropping the
/// message and leaving its device session behind).
#[test]
fn a_digest_finished_on_another_thread_is_kept() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(300 << 10, 81);
    let mut d = wd_crypto::Digest::new("sha256", &[]).unwrap();
    d.update(&data).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let e = d.finish().unwrap_err();
            assert!(e.to_string().contains("another thread"), "{e}");
        });
    });
    let got = d.finish().unwrap();
    let want = openssl::hash::hash(openssl::hash::MessageDigest::sha256(), &data).unwrap();
    assert_eq!(got, want.to_vec());
}

/// The chain is given only for a message under way: a CBC session never
/// given an IV, and an XTS session whose data unit is done, have none (the
/// old IV was handed out as if the stream went on from it).
#[test]
fn no_chain_without_a_message_under_way() {
    let _g = setup(Policy::Offload, 0);
    let mut cbc = Cipher::new("aes-128-cbc", &noise(16, 91), Direction::Encrypt).unwrap();
    assert!(cbc.chain().is_err());
    cbc.set_iv(&noise(16, 92)).unwrap();
    let mut out = vec![0u8; 64];
    cbc.update(&noise(64, 93), &mut out).unwrap();
    assert_eq!(cbc.chain().unwrap(), (out[48..].try_into().unwrap(), 0));
    let mut xts = Cipher::new("aes-128-xts", &noise(32, 94), Direction::Encrypt).unwrap();
    xts.set_iv(&noise(16, 95)).unwrap();
    xts.update(&noise(64, 96), &mut out).unwrap();
    assert!(xts.chain().is_err());
}

/// A finish refused because the output is shorter than the request gives
/// the job's staging slots back (they were lost for good: after 64 such
/// refusals every start on the thread was Busy), and ends the message.
#[test]
fn a_finish_refused_for_a_short_output_gives_its_slots_back() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(64 << 10, 3);
    let mut c = Cipher::new("aes-128-cbc", &[1u8; 16], Direction::Encrypt).unwrap();
    let mut out = vec![0u8; data.len()];
    for i in 0..80 {
        c.set_iv(&[2u8; 16]).unwrap();
        let j = match c.start_offload(&data, &mut out) {
            Ok(j) => j,
            Err(e) => panic!("start {i} after {i} refused finishes: {e:?}"),
        };
        assert!(!j.is_done(), "on the device");
        assert!(c.finish(j, &mut out[..16]).is_err());
        assert!(
            c.update(&data[..16], &mut out[..16]).is_err(),
            "the message ended"
        );
    }
}

/// Jobs dropped unfinished: their slots come back once the device is done
/// (after 64 every start on the thread was Busy), the message ends (the
/// next request needs an IV), and the stream goes on from a new IV with
/// OpenSSL's output (the stream counted the jobs in flight for ever: every
/// set_iv was refused).
#[test]
fn jobs_dropped_unfinished_give_their_slots_back_and_end_the_message() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(64 << 10, 9);
    let mut c = Cipher::new("aes-128-cbc", &[4u8; 16], Direction::Encrypt).unwrap();
    let mut out = vec![0u8; data.len()];
    for i in 0..200 {
        match c.set_iv(&[5u8; 16]) {
            Ok(()) => {}
            Err(e) => panic!("set_iv {i} after {i} dropped jobs: {e}"),
        }
        let j = match c.start_offload(&data, &mut out) {
            Ok(j) => j,
            Err(e) => panic!("start {i} after {i} dropped jobs: {e:?}"),
        };
        assert!(!j.is_done(), "on the device");
        drop(j);
        assert!(
            c.update(&data[..16], &mut out[..16]).is_err(),
            "the message ended"
        );
    }
    c.set_iv(&[6u8; 16]).unwrap();
    let mut got = vec![0u8; data.len()];
    let j = c.start_offload(&data, &mut got).unwrap();
    c.finish(j, &mut got).unwrap();
    assert!(got == reference("aes-128-cbc", &[4u8; 16], &[6u8; 16], &data, true));
}

/// A poll refused because the output is shorter than the request hands
/// the job back, to be finished with the right output (it waited for the
/// device, blocking, and handed back an empty job).
#[test]
fn a_poll_refused_for_a_short_output_hands_the_job_back() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(64 << 10, 5);
    let want = reference("aes-128-ecb", &[2u8; 16], &[], &data, true);
    let mut c = Cipher::new("aes-128-ecb", &[2u8; 16], Direction::Encrypt).unwrap();
    let mut out = vec![0u8; data.len()];
    let j = c.start_offload(&data, &mut out).unwrap();
    assert!(!j.is_done(), "on the device");
    let j = match c.poll(j, &mut out[..16]) {
        Err((j, Some(e))) => {
            assert!(e.to_string().contains("shorter"), "{e}");
            j
        }
        other => panic!("{:?}", other.map_err(|(_, e)| e)),
    };
    assert_eq!(c.finish(j, &mut out).unwrap(), data.len());
    assert!(out == want);
}

/// With the CPU fallback off, a synchronous request without enough free
/// slots (this thread's other jobs hold them) is Busy, as a digest or AEAD
/// request is: it read "no WrapDrive queue".
#[test]
fn a_window_without_free_slots_is_busy_with_the_fallback_off() {
    let _g = setup(Policy::Offload, 0);
    let held = hold_slots(63);
    config::set_fallback(false);
    let mut c = Cipher::new("aes-128-cbc", &[1u8; 16], Direction::Encrypt).unwrap();
    c.set_iv(&[0u8; 16]).unwrap();
    let data = noise(128 << 10, 4);
    let mut out = vec![0u8; data.len()];
    let r = c.update_offload(&data, &mut out);
    config::set_fallback(true);
    held.release();
    assert!(matches!(r, Err(CryptoError::Busy)), "{r:?}");
}

/// A scatter list whose later piece finds too few free slots even after
/// the list's own jobs finished (another stream's jobs hold them): it
/// runs as a synchronous request does, and with the fallback off Busy
/// leaves the stream where the call found it, so that sending the list
/// again is right (it was Busy with the first piece done and the chain
/// moved: the list sent again encrypted its first piece from there).
#[test]
fn a_scatter_list_short_of_slots_is_one_stream_or_busy_with_nothing_done() {
    let _g = setup(Policy::Offload, 0);
    let (key, iv) = ([4u8; 16], [8u8; 16]);
    let a = noise(64 << 10, 5);
    let b = noise(MIB2, 6);
    let all = [&a[..], &b[..]].concat();
    let want = reference("aes-128-cbc", &key, &iv, &all, true);
    for fallback in [true, false] {
        let held = hold_slots(40);
        config::set_fallback(fallback);
        let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
        c.set_iv(&iv).unwrap();
        let (mut oa, mut ob) = (vec![0u8; a.len()], vec![0u8; b.len()]);
        let r = c.update_sg(&[&a, &b], &mut [&mut oa, &mut ob]);
        config::set_fallback(true);
        held.release();
        match (fallback, r) {
            (true, r) => assert_eq!(r.unwrap(), all.len()),
            (false, Err(CryptoError::Busy)) => {
                c.update_sg(&[&a, &b], &mut [&mut oa, &mut ob]).unwrap();
            }
            (false, r) => panic!("{r:?}"),
        }
        assert!(oa == want[..a.len()], "first piece (fallback {fallback})");
        assert!(ob == want[a.len()..], "second piece (fallback {fallback})");
    }
}

/// A job finished through another cipher than the one that started it is
/// refused, and stays its own cipher's (it panicked on the other one's
/// count of requests in flight, or wrapped it in a release build).
#[test]
fn a_job_finished_by_another_cipher_is_refused() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(64 << 10, 7);
    let want = reference("aes-128-ecb", &[2u8; 16], &[], &data, true);
    let mut a = Cipher::new("aes-128-ecb", &[2u8; 16], Direction::Encrypt).unwrap();
    let mut b = Cipher::new("aes-128-ecb", &[2u8; 16], Direction::Encrypt).unwrap();
    let mut out = vec![0u8; data.len()];
    let j = a.start_offload(&data, &mut out).unwrap();
    assert!(!j.is_done());
    let j = match b.poll(j, &mut out) {
        Err((j, Some(e))) => {
            assert!(e.to_string().contains("another cipher"), "{e}");
            j
        }
        other => panic!("{:?}", other.map_err(|(_, e)| e)),
    };
    assert_eq!(a.finish(j, &mut out).unwrap(), data.len());
    assert!(out == want);
}

/// The same with a job of the list's own stream in flight, which the call
/// cannot finish: Busy comes before any piece is done (it came after the
/// first, the CTR counter moved past it, and the list sent again was
/// encrypted from there).
#[test]
fn a_scatter_list_beside_a_job_of_its_stream_is_busy_with_nothing_done() {
    let _g = setup(Policy::Offload, 0);
    let held = hold_slots(40);
    let (key, iv) = ([4u8; 16], [8u8; 16]);
    let (j, a, b) = (noise(64 << 10, 1), noise(64 << 10, 5), noise(MIB2, 6));
    let all = [&j[..], &a[..], &b[..]].concat();
    let want = reference("aes-128-ctr", &key, &iv, &all, true);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let mut oj = vec![0u8; j.len()];
    let job = c.start_offload(&j, &mut oj).unwrap();
    assert!(!job.is_done());
    let (mut oa, mut ob) = (vec![0u8; a.len()], vec![0u8; b.len()]);
    let r = c.update_sg(&[&a, &b], &mut [&mut oa, &mut ob]);
    held.release();
    c.finish(job, &mut oj).unwrap();
    assert!(matches!(r, Err(CryptoError::Busy)), "{r:?}");
    c.update_sg(&[&a, &b], &mut [&mut oa, &mut ob]).unwrap();
    assert!(oj == want[..j.len()]);
    assert!(
        oa == want[j.len()..j.len() + a.len()],
        "first piece of the list"
    );
    assert!(ob == want[j.len() + a.len()..], "second piece of the list");
}

/// A GCM finish refused before it was sent (no free slot: Busy; another
/// thread's message: BadState) leaves the message under way, and finished
/// again it writes the right tag (the message had ended: the retry was
/// "begin a message first", and no tag was ever made).
#[test]
fn a_refused_gcm_finish_keeps_its_message() {
    let _g = setup(Policy::Offload, 0);
    let (key, iv, pt) = (noise(16, 81), noise(12, 82), noise(4096, 83));
    let mut want_tag = [0u8; 16];
    let want = openssl::symm::encrypt_aead(
        ocipher("aes-128-gcm"),
        &key,
        Some(&iv),
        b"ad",
        &pt,
        &mut want_tag,
    )
    .unwrap();
    let mut a = Aead::new("aes-128-gcm", &key).unwrap();
    let begun = |a: &mut Aead| {
        let mut ct = vec![0u8; pt.len()];
        a.begin(Direction::Encrypt, &iv).unwrap();
        a.aad(b"ad").unwrap();
        a.update(&pt, &mut ct).unwrap();
        assert!(ct == want);
    };
    let mut tag = [0u8; 16];
    begun(&mut a);
    let held = hold_slots(64);
    let r = a.finish_seal(&mut tag);
    held.release();
    assert!(matches!(r, Err(CryptoError::Busy)), "{r:?}");
    a.finish_seal(&mut tag).unwrap();
    assert_eq!(tag, want_tag, "finished again after Busy");
    begun(&mut a);
    std::thread::scope(|s| {
        s.spawn(|| {
            let e = a.finish_seal(&mut [0u8; 16]).unwrap_err();
            assert!(e.to_string().contains("another thread"), "{e}");
        });
    });
    let mut tag = [0u8; 16];
    a.finish_seal(&mut tag).unwrap();
    assert_eq!(tag, want_tag, "finished on its own thread");
}

/// Jobs longer than a slot are staged whole in a large staging area
/// (32 units of 1 MiB; a second is made when the first is full): 32 jobs
/// of 1 MiB are on the device at once, each stream goes on with a second
/// job from where the first left it, and the output is OpenSSL's. (With
/// the slots only, the fifth was Busy.)
#[test]
fn thirty_two_jobs_of_a_mib_are_in_flight_at_once() {
    let _g = setup(Policy::Offload, 0);
    jobs_all_in_flight(32, 1 << 20);
}

/// As [`thirty_two_jobs_of_a_mib_are_in_flight_at_once`], filling both
/// large areas: 32 jobs of 2 MiB, then 64 of 1 MiB.
#[test]
fn both_large_areas_hold_jobs_at_once() {
    let _g = setup(Policy::Offload, 0);
    jobs_all_in_flight(32, 2 << 20);
    jobs_all_in_flight(64, 1 << 20);
}

/// `streams` CBC streams, each sending two jobs of `len` bytes: every
/// job of a round on the device at once, finished in reverse order, and
/// OpenSSL's output.
fn jobs_all_in_flight(streams: usize, len: usize) {
    let key = noise(16, 21);
    let mut streams: Vec<(Cipher, Vec<u8>, Vec<u8>)> = (0..streams)
        .map(|i| {
            let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
            c.set_iv(&[i as u8; 16]).unwrap();
            (c, noise(2 * len, 100 + i as u64), vec![0u8; 2 * len])
        })
        .collect();
    for half in 0..2 {
        let range = half * len..(half + 1) * len;
        let mut jobs = Vec::new();
        for (i, (c, data, out)) in streams.iter_mut().enumerate() {
            let j = match c.start_offload(&data[range.clone()], &mut out[range.clone()]) {
                Ok(j) => j,
                Err(e) => panic!("job {i} of {len} bytes refused: {e:?}"),
            };
            assert!(!j.is_done(), "job {i} of {len} bytes ran here");
            jobs.push(j);
        }
        for (i, j) in jobs.into_iter().enumerate().rev() {
            let (c, _, out) = &mut streams[i];
            c.finish(j, &mut out[range.clone()]).unwrap();
        }
    }
    for (i, (_, data, out)) in streams.iter().enumerate() {
        let want = reference("aes-128-cbc", &key, &[i as u8; 16], data, true);
        assert!(*out == want, "stream {i}");
    }
}

/// Long jobs of every chained mode and of sizes around the large area's
/// units, more of them than it holds (the rest take slots, are Busy, or
/// run here), finished in a scrambled order, each stream continued by a
/// second job: OpenSSL's output.
#[test]
fn long_jobs_of_every_mode_beyond_the_large_area_match_openssl() {
    let _g = setup(Policy::Offload, 0);
    let sizes = [
        (64 << 10) + 16,
        1 << 20,
        (1 << 20) + 48,
        3 << 20,
        (5 << 20) - 32,
        8 << 20,
        (8 << 20) + 16,
    ];
    let modes = [
        ("aes-128-cbc", true),
        ("aes-128-cbc", false),
        ("aes-256-ctr", true),
    ];
    struct Stream {
        c: Cipher,
        name: &'static str,
        enc: bool,
        key: Vec<u8>,
        data: Vec<u8>,
        cut: usize,
        out: Vec<u8>,
    }
    let mut streams: Vec<Stream> = (0..30)
        .map(|i| {
            let (name, enc) = modes[i % modes.len()];
            let key = noise(if name.starts_with("aes-256") { 32 } else { 16 }, i as u64);
            let dir = if enc {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            };
            let mut c = Cipher::new(name, &key, dir).unwrap();
            c.set_iv(&[i as u8; 16]).unwrap();
            // A CTR stream's first job ends inside a keystream block.
            let odd = if name.ends_with("ctr") { 5 } else { 0 };
            let cut = sizes[i % sizes.len()] + odd;
            let len = cut + sizes[(i + 3) % sizes.len()];
            Stream {
                c,
                name,
                enc,
                key,
                data: noise(len, 200 + i as u64),
                cut,
                out: vec![0u8; len],
            }
        })
        .collect();
    for half in 0..2 {
        let mut jobs: Vec<(usize, wd_crypto::Job)> = Vec::new();
        let mut on_device = 0;
        let part = |s: &Stream| {
            if half == 0 {
                0..s.cut
            } else {
                s.cut..s.data.len()
            }
        };
        for i in 0..streams.len() {
            let j = loop {
                let s = &mut streams[i];
                let r = part(s);
                match s.c.start_offload(&s.data[r.clone()], &mut s.out[r]) {
                    Ok(j) => break j,
                    Err(CryptoError::Busy) => {
                        // This thread's jobs hold what it needs: finish the
                        // oldest (another stream's) and send it again.
                        assert!(!jobs.is_empty(), "Busy with nothing in flight");
                        let (k, j) = jobs.remove(0);
                        let t = &mut streams[k];
                        let r = part(t);
                        t.c.finish(j, &mut t.out[r]).unwrap();
                    }
                    Err(e) => panic!("stream {i}: {e:?}"),
                }
            };
            on_device += usize::from(!j.is_done());
            jobs.push((i, j));
        }
        assert!(on_device >= 8, "{on_device} jobs on the device");
        // Scrambled: every third, then the rest backwards.
        let mut order: Vec<usize> = (0..jobs.len()).step_by(3).collect();
        order.extend((0..jobs.len()).rev().filter(|k| k % 3 != 0));
        let mut jobs: Vec<Option<(usize, wd_crypto::Job)>> = jobs.into_iter().map(Some).collect();
        for k in order {
            let (i, j) = jobs[k].take().unwrap();
            let s = &mut streams[i];
            let r = part(s);
            s.c.finish(j, &mut s.out[r]).unwrap();
        }
    }
    for (i, s) in streams.iter().enumerate() {
        let want = reference(s.name, &s.key, &[i as u8; 16], &s.data, s.enc);
        assert!(s.out == want, "stream {i} ({} {})", s.name, s.data.len());
    }
}

/// Long jobs dropped unfinished, or refused a short output, give their
/// run of the large area back: after 100 of each, 64 jobs of 1 MiB are
/// in flight at once again.
#[test]
fn long_jobs_dropped_or_refused_give_their_run_back() {
    let _g = setup(Policy::Offload, 0);
    let data = noise(1 << 20, 31);
    let mut c = Cipher::new("aes-128-cbc", &[7u8; 16], Direction::Encrypt).unwrap();
    let mut out = vec![0u8; data.len()];
    for i in 0..200 {
        c.set_iv(&[8u8; 16]).unwrap();
        let j = match c.start_offload(&data, &mut out) {
            Ok(j) => j,
            Err(e) => panic!("start {i}: {e:?}"),
        };
        assert!(!j.is_done(), "job {i} on the device");
        if i % 2 == 0 {
            drop(j);
        } else {
            assert!(c.finish(j, &mut out[..16]).is_err());
        }
    }
    c.set_iv(&[9u8; 16]).unwrap();
    let j = c.start_offload(&data, &mut out).unwrap();
    assert!(!j.is_done());
    c.finish(j, &mut out).unwrap();
    assert!(out == reference("aes-128-cbc", &[7u8; 16], &[9u8; 16], &data, true));
    jobs_all_in_flight(64, 1 << 20);
}

/// A job of 4-8 MiB that cannot use the large area (in place here, and a
/// legacy queue below) needs more than the 64 slots: it goes to the
/// device a window at a time, as before the large area (it was Busy for
/// ever, and so computed on the CPU, counted as "no queue").
#[test]
#[allow(unsafe_code)]
fn an_in_place_job_of_6_mib_goes_to_the_device() {
    let _g = setup(Policy::Offload, 0);
    let was = config::in_place();
    config::set_in_place(true);
    let n = 6 << 20;
    let key = noise(16, 41);
    let iv = noise(16, 42);
    let data = noise(n, 43);
    let src = wrapdrive::SharedBuf::new(n).unwrap();
    let dst = wrapdrive::SharedBuf::new(n).unwrap();
    src.write(0, &data);
    let mut c = Cipher::new("aes-128-ctr", &key, Direction::Encrypt).unwrap();
    c.set_iv(&iv).unwrap();
    let before = wd_crypto::stats();
    // The C API's way in: slices over shared memory (wd_alloc buffers).
    // SAFETY: src's n bytes, alive to the end; only the device writes dst
    // (in place), and only while the job is in flight, when the test does
    // not touch it.
    let input = unsafe { std::slice::from_raw_parts(src.addr() as *const u8, n) };
    // SAFETY: as above, dst's n bytes.
    let output = unsafe { std::slice::from_raw_parts_mut(dst.addr() as *mut u8, n) };
    let j = c.start_offload(input, output).unwrap();
    c.finish(j, output).unwrap();
    let after = wd_crypto::stats();
    config::set_in_place(was);
    assert_eq!(
        dst.to_vec(),
        reference("aes-128-ctr", &key, &iv, &data, true)
    );
    assert_eq!(
        after.cpu_bytes - before.cpu_bytes,
        0,
        "6 MiB offload job ran on the CPU"
    );
}

/// As [`an_in_place_job_of_6_mib_goes_to_the_device`] with a legacy
/// queue (it has no large area).
#[test]
fn a_legacy_job_of_6_mib_goes_to_the_device() {
    let _g = setup(Policy::Offload, 0);
    config::set_legacy(true);
    let n = 6 << 20;
    let key = noise(16, 51);
    let iv = noise(16, 52);
    let data = noise(n, 53);
    let mut out = vec![0u8; n];
    let r = std::thread::spawn(move || {
        let mut c = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
        c.set_iv(&iv).unwrap();
        let before = wd_crypto::stats();
        let j = c.start_offload(&data, &mut out).unwrap();
        c.finish(j, &mut out).unwrap();
        let after = wd_crypto::stats();
        (
            after.cpu_bytes - before.cpu_bytes,
            out == reference("aes-128-cbc", &key, &iv, &data, true),
        )
    })
    .join();
    config::set_legacy(false);
    let (cpu, right) = r.unwrap();
    assert!(right, "output");
    assert_eq!(cpu, 0, "6 MiB offload job ran on the CPU");
}
