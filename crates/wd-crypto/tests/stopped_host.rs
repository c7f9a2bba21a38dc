//! A host that takes connections and never answers (stopped, hung): each
//! attempt to reach it waits the connection deadline, so after one the
//! library computes on the CPU ten times that long before asking again
//! (it asked every second: a thread spent most of its time connecting).
//! Its own test binary: it sets the process's environment.

use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use wd_crypto::{config, Digest, Policy};

#[test]
fn a_stopped_host_does_not_take_most_of_a_callers_time() {
    let dir = wd_testutil::tempdir("wd-crypto-stopped");
    let path = dir.join("stopped.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    std::env::set_var("WD_CRYPTO_HOST", &path);
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "400");
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
    let t0 = Instant::now();
    let mut blocked = Duration::ZERO;
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        let mut d = Digest::new("sha256", &[]).unwrap();
        d.update(&[1u8; 4096]).unwrap();
        d.finish().unwrap();
        let took = t.elapsed();
        if took > Duration::from_millis(200) {
            blocked += took;
        }
        n += 1;
    }
    let share = blocked.as_secs_f64() / t0.elapsed().as_secs_f64();
    // One attempt (0.4 s) in the 3 s; asking every second made it three.
    assert!(
        share < 0.25,
        "{:.0}% of the time blocked connecting to a stopped host ({n} digests)",
        share * 100.0
    );
}
