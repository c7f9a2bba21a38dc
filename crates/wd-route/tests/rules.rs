//! The router's rules in the order its documentation gives them.

use std::time::Duration;

use wd_route::{decide, Costs, Policy, Queue, Request, Route, Settings, Why};

/// Rule 3 ("no queue: the CPU when fallback is allowed, else the
/// device") is about a missing queue. With a queue at hand, fallback off
/// must not turn the auto policy into `offload`: rule 5 (overlap below
/// its minimum: the CPU) and rule 6 (the measured cheaper path) still
/// apply.
#[test]
fn fallback_off_with_a_queue_keeps_the_auto_rules() {
    let strict = Settings {
        policy: Policy::Auto,
        threshold: 256,
        fallback: false,
    };
    let mut c = Costs::new(1);
    // Rule 5: an overlapped request under the operation's overlap minimum.
    let small = Request {
        op: 0,
        bytes: 1024,
        overlapped: true,
        overlap_min: Some(4096),
    };
    assert_eq!(
        decide(&strict, || Queue::Ready, &mut c, small).route,
        Route::Cpu(Why::Policy),
        "rule 5 ignored with fallback off"
    );
    // Rule 6: the CPU measured three times cheaper than the device.
    let lone = Request {
        op: 0,
        bytes: 10_000,
        overlapped: false,
        overlap_min: None,
    };
    let mut on_dev = 0;
    for _ in 0..20_000 {
        let d = decide(&strict, || Queue::Ready, &mut c, lone);
        let on_cpu = d.route != Route::Device;
        if d.timed {
            let ns = if on_cpu { 10_000 } else { 30_000 };
            c.record(0, 10_000, on_cpu, Duration::from_nanos(ns));
        }
        on_dev += usize::from(!on_cpu);
    }
    assert!(
        on_dev < 200,
        "{on_dev} of 20000 requests went to the device measured 3x dearer (fallback off, queue ready)"
    );
}

/// Rule 3 without fallback and a queue not yet tried: the device, to find
/// out (a first sample on the CPU succeeded where the caller asked to be
/// told that no device is there). With fallback the queue's state changes
/// nothing: the measured rules apply.
#[test]
fn fallback_off_tries_an_untried_queue_first() {
    let strict = Settings {
        policy: Policy::Auto,
        threshold: 256,
        fallback: false,
    };
    let lenient = Settings {
        fallback: true,
        ..strict
    };
    for overlapped in [false, true] {
        let r = Request {
            op: 0,
            bytes: 1024,
            overlapped,
            overlap_min: Some(4096),
        };
        let mut c = Costs::new(1);
        assert_eq!(
            decide(&strict, || Queue::Untried, &mut c, r),
            wd_route::Decision {
                route: Route::Device,
                timed: false
            },
            "overlapped {overlapped}"
        );
        let mut c = Costs::new(1);
        assert_eq!(
            decide(&lenient, || Queue::Untried, &mut c, r).route,
            decide(&lenient, || Queue::Ready, &mut Costs::new(1), r).route,
            "overlapped {overlapped}"
        );
    }
    // Below the threshold the settings decide before the queue is asked.
    let small = Request {
        op: 0,
        bytes: 100,
        overlapped: false,
        overlap_min: None,
    };
    assert_eq!(
        decide(&strict, || Queue::Untried, &mut Costs::new(1), small).route,
        Route::Cpu(Why::Threshold)
    );
}
