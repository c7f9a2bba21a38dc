//! Every CPU request is counted once, under the reason it ran on
//! the CPU (no host here: everything runs on the CPU).

use wd_crypto::{config, stats, Aead, Digest, Policy};

static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// A digest too long to gather (it streams) kept on the CPU by the
/// threshold is counted below the threshold, not as the policy's choice.
#[test]
fn streamed_digest_below_threshold_is_counted_as_threshold() {
    let _env = serial();
    std::env::set_var("WD_CRYPTO_HOST", "/nonexistent/wd.sock");
    config::set_policy(Policy::Auto);
    config::set_threshold(1 << 30);
    config::set_fallback(true);
    let data = vec![7u8; 256 * 1024];
    let before = stats();
    let mut d = Digest::new("sha256", &[]).unwrap();
    d.update(&data).unwrap();
    d.finish().unwrap();
    let s = stats();
    config::set_threshold(config::DEFAULT_THRESHOLD);
    assert!(
        s.cpu_below_threshold > before.cpu_below_threshold,
        "streamed digest below the threshold: {before:?} -> {s:?}"
    );
    assert_eq!(s.cpu_policy - before.cpu_policy, 0, "{before:?} -> {s:?}");
}

/// A one-shot AEAD open with no queue is one CPU request, counted once.
#[test]
fn aead_open_without_a_queue_is_counted_once() {
    let _env = serial();
    std::env::set_var("WD_CRYPTO_HOST", "/nonexistent/wd.sock");
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    config::set_fallback(true);
    let key = [1u8; 16];
    let iv = [2u8; 12];
    let pt = vec![5u8; 1024];
    let mut a = Aead::new("aes-128-gcm", &key).unwrap();
    let mut ct = vec![0u8; pt.len()];
    let mut tag = [0u8; 16];
    a.seal(&iv, b"aad", &pt, &mut ct, &mut tag).unwrap();
    // On a thread of its own: the open is its first request, so the
    // router, knowing of no queue yet, sends it to the device.
    let (before, s, back) = std::thread::scope(|t| {
        t.spawn(|| {
            let mut a = Aead::new("aes-128-gcm", &key).unwrap();
            let before = stats();
            let mut back = vec![0u8; ct.len()];
            a.open(&iv, b"aad", &ct, &tag, &mut back).unwrap();
            (before, stats(), back)
        })
        .join()
        .unwrap()
    });
    config::set_policy(Policy::Auto);
    config::set_threshold(config::DEFAULT_THRESHOLD);
    assert_eq!(back, pt);
    assert_eq!(
        (
            s.cpu_requests - before.cpu_requests,
            s.cpu_bytes - before.cpu_bytes
        ),
        (1, pt.len() as u64),
        "one open of {} bytes: {before:?} -> {s:?}",
        pt.len()
    );
}
