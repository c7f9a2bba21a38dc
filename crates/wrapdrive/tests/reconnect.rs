//! A host killed with requests in flight and restarted on the same socket:
//! the client library makes its queue again by itself (same parameters,
//! same shares), sends again what its message format says is safe, fails
//! the rest with `STATUS_RESTARTED`, and counts it all; with no host
//! coming back, the caller hears `HostGone` once the window has passed.
#![allow(unsafe_code)]

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_dummy_msg::CopyMsg;
use wd_host::{DeviceConfig, HostConfig};
use wd_testutil::{tempdir, wait_until, Role, TempDir};
use wrapdrive::{Capability, Desc, HostConn, Queue, SharedBuf, Status, STATUS_RESTARTED};

/// Entry point of the host process; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    assert_eq!(role, "host");
    let mut cfg = common::dummy_host(std::env::var("WD_TEST_SOCKET").unwrap(), 0o600);
    if let Ok(n) = std::env::var("WD_TEST_SHARES") {
        cfg.limits.shares_per_uid = n.parse().unwrap();
        cfg.limits.exempt_owner = false;
    }
    common::serve_until_stdin_closes(&cfg);
}

/// A host process on `socket`, returned once it serves.
fn start_host(socket: &str) -> Role {
    start_host_with(socket, &[])
}

/// The same with environment variables for the host (`WD_TEST_SHARES`:
/// the shares one user may have, the owner not exempt).
fn start_host_with(socket: &str, env: &[(&str, &str)]) -> Role {
    // A killed host leaves its socket file behind.
    let _ = std::fs::remove_file(socket);
    let mut c = Role::command("host");
    c.env("WD_TEST_SOCKET", socket).stdin(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut role = Role::spawn(c);
    assert_eq!(role.read_report(), "ready");
    role
}

/// Freeze the host (so what is sent stays in flight), then kill it.
fn freeze(host: &Role) {
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    wd_testutil::wait_stopped(host.pid());
}

fn kill(host: &mut Role) {
    let mut status = 0;
    // SAFETY: plain kill(2) and waitpid(2) of our own child.
    unsafe {
        libc::kill(host.pid(), libc::SIGKILL);
        libc::waitpid(host.pid(), &mut status, 0);
    }
}

struct Setup {
    _dir: TempDir,
    socket: String,
    host: Role,
    conn: Arc<HostConn>,
}

fn setup(name: &str) -> Setup {
    let dir = tempdir(name);
    let socket = dir.join("wd.sock");
    let host = start_host(&socket);
    let conn = HostConn::connect(&socket).unwrap();
    Setup {
        _dir: dir,
        socket,
        host,
        conn,
    }
}

const LEN: usize = 64 << 10;

fn copy(src: u64, dst: u64) -> Desc {
    CopyMsg {
        src,
        dst,
        len: LEN as u64,
    }
    .to_desc(0)
}

/// Send `n` copies (distinct destinations) to a frozen host, kill it and
/// start another; returns the queue, its memory and the new host.
fn copies_across_a_restart(
    s: &mut Setup,
    redo: bool,
    n: usize,
) -> (Queue, SharedBuf, SharedBuf, wd_heap::Buffer) {
    let mut q = s
        .conn
        .request_queue(&Capability::new("memcpy").depth(16))
        .unwrap();
    if redo {
        q.set_redo_policy(wd_dummy_msg::redo_safe);
    }
    let src = SharedBuf::new(LEN).unwrap();
    let dst = SharedBuf::new(LEN * n).unwrap();
    let heap = wd_heap::Heap::process()
        .alloc(LEN as u64, &wd_heap::AllocOptions::default())
        .unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    q.share_buffer(&heap).unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &data);
    freeze(&s.host);
    for i in 0..n {
        q.send(copy(src.addr(), dst.addr() + (i * LEN) as u64), i as u64)
            .unwrap();
    }
    kill(&mut s.host);
    s.host = start_host(&s.socket);
    (q, src, dst, heap)
}

#[test]
fn copies_in_flight_are_sent_again_on_the_restarted_host() {
    let mut s = setup("wd-reconnect-redo");
    let (mut q, src, dst, heap) = copies_across_a_restart(&mut s, true, 4);
    let old_id = q.id();
    let mut seen = [false; 4];
    for _ in 0..4 {
        let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(c.desc.status, 0, "copy {} on the new host", c.cookie);
        seen[c.cookie as usize] = true;
    }
    assert!(seen.iter().all(|&x| x));
    let mut want = vec![0u8; LEN];
    src.read(0, &mut want);
    for i in 0..4 {
        let mut got = vec![0u8; LEN];
        dst.read((i * LEN) as u64, &mut got);
        assert!(got == want, "copy {i} landed");
    }
    let r = q.recovery_stats();
    assert_eq!((r.reconnects, r.redone, r.failed), (1, 4, 0));
    assert_eq!(s.conn.epoch(), 1);
    // The heap buffer was shared again (by its kept descriptor).
    let d = q.call(copy(src.addr(), heap.addr())).unwrap();
    assert_eq!(d.status, 0);
    assert_eq!(heap.to_vec()[..LEN], want[..]);
    // The new host shows the queue's counters; the old queue id may be
    // reused, so look the queue up by its new id.
    let base = format!("dev0/queues/q{}/client", q.id());
    assert_eq!(s.conn.get_attr(&format!("{base}/reconnects")).unwrap(), "1");
    assert_eq!(s.conn.get_attr(&format!("{base}/redone")).unwrap(), "4");
    let _ = old_id;
}

#[test]
fn without_a_redo_policy_requests_in_flight_fail_with_restarted() {
    let mut s = setup("wd-reconnect-fail");
    let (mut q, src, dst, _heap) = copies_across_a_restart(&mut s, false, 3);
    for _ in 0..3 {
        let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(c.desc.status, STATUS_RESTARTED, "request {}", c.cookie);
    }
    let r = q.recovery_stats();
    assert_eq!((r.reconnects, r.redone, r.failed), (1, 0, 3));
    // The queue works on the new host, with its memory shared again.
    let d = q.call(copy(src.addr(), dst.addr())).unwrap();
    assert_eq!(d.status, 0);
}

#[test]
fn a_send_that_finds_the_host_restarted_is_not_sent_without_a_redo_policy() {
    let mut s = setup("wd-reconnect-send");
    let mut q = s.conn.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(q.call(Desc::default()).unwrap().status, 0);
    kill(&mut s.host);
    s.host = start_host(&s.socket);
    // The queue's engine slept: this send rings its doorbell and finds
    // the host gone. Sessions named by such a request would be gone.
    std::thread::sleep(Duration::from_millis(50));
    let err = match q.send(Desc::default(), 9) {
        // The engine was awake (no doorbell): the request waits in the
        // dead ring, and the wait finds the host gone.
        Ok(()) => {
            let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
            assert_eq!(c.desc.status, STATUS_RESTARTED);
            Status::HostGone
        }
        Err(e) => e.status(),
    };
    assert_eq!(err, Status::HostGone);
    assert_eq!(q.recovery_stats().reconnects, 1);
    assert_eq!(q.call(Desc::default()).unwrap().status, 0);
}

#[test]
fn no_host_within_the_window_is_host_gone() {
    let mut s = setup("wd-reconnect-none");
    let mut q = s.conn.request_queue(&Capability::new("memcpy")).unwrap();
    freeze(&s.host);
    q.send(Desc::default(), 1).unwrap();
    kill(&mut s.host);
    let t = Instant::now();
    let e = q.recv_sync(None).unwrap_err();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(wrapdrive::DEFAULT_RECONNECT_MS / 2)
            && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert!(e.to_string().contains("did not come back"), "{e}");
}

/// An unshare that finds the host gone succeeds (a dead host reaches
/// nothing), and the range is not shared again on the restarted host: the
/// memory may go back to the allocator and be shared anew.
#[test]
fn an_unshare_on_a_dead_host_is_not_undone_by_the_restart() {
    let mut s = setup("wd-reconnect-unshare");
    let mut q = s
        .conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    let (a, b) = (SharedBuf::new(LEN).unwrap(), SharedBuf::new(LEN).unwrap());
    q.share(a.addr(), a.len()).unwrap();
    q.share(b.addr(), b.len()).unwrap();
    kill(&mut s.host);
    q.unshare(b.addr(), b.len()).unwrap();
    s.host = start_host(&s.socket);
    // b is not shared on the new host: a copy into it faults, and it can
    // be shared again.
    assert_ne!(q.call(copy(a.addr(), b.addr())).unwrap().status, 0);
    q.share(b.addr(), b.len()).unwrap();
    let st = q.call(copy(a.addr(), b.addr())).unwrap().status;
    assert_eq!(
        st,
        0,
        "{:?} a={:#x} b={:#x}",
        q.faults(8).unwrap(),
        a.addr(),
        b.addr()
    );
}

/// A restarted host that refuses the queue's memory (its limit on shares
/// is lower): nothing is sent again, every request in flight completes as
/// restarted instead of waiting for ever on the new ring, and the error
/// names the limit.
#[test]
fn a_restart_that_cannot_share_the_memory_again_fails_what_was_in_flight() {
    let mut s = setup("wd-reconnect-refused");
    let mut q = s
        .conn
        .request_queue(&Capability::new("memcpy").depth(16))
        .unwrap();
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    let src = SharedBuf::new(LEN).unwrap();
    let dst = SharedBuf::new(3 * LEN).unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    freeze(&s.host);
    for i in 0..3 {
        q.send(copy(src.addr(), dst.addr() + (i * LEN) as u64), i as u64)
            .unwrap();
    }
    kill(&mut s.host);
    s.host = start_host_with(&s.socket, &[("WD_TEST_SHARES", "1")]);
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let t = Instant::now();
    while done.len() < 3 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waiting: {done:?} {errors:?}"
        );
        match q.recv_sync(Some(Duration::from_secs(2))) {
            Ok(c) => done.push((c.cookie, c.desc.status)),
            Err(e) => {
                assert_ne!(
                    e.status(),
                    Status::Again,
                    "a request never completed: {done:?}"
                );
                errors.push(e.to_string());
            }
        }
    }
    assert!(
        done.iter().all(|&(_, st)| st == STATUS_RESTARTED),
        "{done:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("shares_per_uid")),
        "{errors:?}"
    );
    // Without its memory the queue sends nothing more (a copy would fault
    // on the host, or run on the part it has), and says why; it can still
    // give its ranges back and be released.
    let e = q.send(copy(src.addr(), dst.addr()), 9).unwrap_err();
    assert_eq!(e.status(), Status::BadState, "{e}");
    assert!(e.to_string().contains("refused"), "{e}");
    let e = q.share(src.addr(), src.len()).unwrap_err();
    assert_eq!(e.status(), Status::BadState, "{e}");
    q.unshare(dst.addr(), dst.len()).unwrap();
    q.unshare(src.addr(), src.len()).unwrap();
    q.release().unwrap();
}

#[test]
fn a_queue_refused_by_one_restarted_host_is_made_again_by_the_next() {
    let mut s = setup("wd-reconnect-refused-once");
    let mut q = s
        .conn
        .request_queue(&Capability::new("memcpy").depth(16))
        .unwrap();
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    let src = SharedBuf::new(LEN).unwrap();
    let dst = SharedBuf::new(LEN).unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    let one = copy(src.addr(), dst.addr());
    q.call(one).unwrap();
    // A restart that refuses the second share (a quota smaller then).
    kill(&mut s.host);
    s.host = start_host_with(&s.socket, &[("WD_TEST_SHARES", "1")]);
    let e = q.call(one).unwrap_err();
    assert_eq!(e.status(), Status::Quota, "{e}");
    let e = q.call(one).unwrap_err();
    assert_eq!(e.status(), Status::BadState, "{e}");
    // Restarted again without the limit: the queue is made again there.
    kill(&mut s.host);
    s.host = start_host(&s.socket);
    let done = q.call(one).unwrap();
    assert_eq!(done.status, 0, "{done:?}");
}

/// Two queues of one connection across a restart, the second used first
/// on the new host: it is made again there with the first one's old id
/// (a restarted host numbers its queues anew), while the first still
/// carries that id. Both share `buf`.
struct StaleAndFresh {
    s: Setup,
    stale: Queue,
    fresh: Queue,
    buf: SharedBuf,
}

fn a_stale_queue_and_a_fresh_one(name: &str) -> StaleAndFresh {
    let mut s = setup(name);
    let mut stale = s.conn.request_queue(&Capability::new("memcpy")).unwrap();
    let mut fresh = s.conn.request_queue(&Capability::new("memcpy")).unwrap();
    fresh.set_redo_policy(wd_dummy_msg::redo_safe);
    let buf = SharedBuf::new(2 * LEN).unwrap();
    stale.share(buf.addr(), buf.len()).unwrap();
    fresh.share(buf.addr(), buf.len()).unwrap();
    let cp = copy(buf.addr(), buf.addr() + LEN as u64);
    assert_eq!(fresh.call(cp).unwrap().status, 0);
    kill(&mut s.host);
    s.host = start_host(&s.socket);
    assert_eq!(fresh.call(cp).unwrap().status, 0);
    assert_eq!(fresh.id(), stale.id(), "the set-up needs the ids to meet");
    StaleAndFresh {
        s,
        stale,
        fresh,
        buf,
    }
}

impl StaleAndFresh {
    /// The fresh queue still copies on the new host, never made again.
    fn fresh_is_untouched(&mut self) {
        let id = self.fresh.id();
        let state = self.s.conn.get_attr(&format!("dev0/queues/q{id}/state"));
        assert!(
            state.is_ok(),
            "queue q{id} (the fresh one's) is gone: {state:?}"
        );
        let cp = copy(self.buf.addr(), self.buf.addr() + LEN as u64);
        let d = self.fresh.call(cp).unwrap();
        assert_eq!(d.status, 0, "the fresh queue's copy");
        assert_eq!(
            (self.fresh.id(), self.fresh.recovery_stats().reconnects),
            (id, 1)
        );
    }
}

/// A queue made under an older connection sends nothing naming its old
/// id on the new one: releasing it released the other queue, whose
/// requests then failed with -ECANCELED (a review found it).
#[test]
fn releasing_a_stale_queue_leaves_the_queue_that_took_its_id() {
    let mut t = a_stale_queue_and_a_fresh_one("wd-stale-release");
    let stale = std::mem::replace(
        &mut t.stale,
        t.s.conn.request_queue(&Capability::new("memcpy")).unwrap(),
    );
    assert_eq!(
        stale.release().map_err(|e| e.status()),
        Err(Status::HostGone)
    );
    t.fresh_is_untouched();
}

/// ... its unshare unmapped the other queue's memory (its next copy
/// faulted, -EFAULT, with the range still shared).
#[test]
fn a_stale_queues_unshare_leaves_the_memory_of_the_queue_that_took_its_id() {
    let mut t = a_stale_queue_and_a_fresh_one("wd-stale-unshare");
    t.stale.unshare(t.buf.addr(), t.buf.len()).unwrap();
    t.fresh_is_untouched();
}

/// ... and its IOMMU policy changed the other queue's (the stale queue
/// is made again, and the policy is its own).
#[test]
fn a_stale_queues_iommu_policy_is_its_own() {
    use wrapdrive::{FaultPolicy, InvalidationMode};
    let mut t = a_stale_queue_and_a_fresh_one("wd-stale-policy");
    t.stale
        .set_iommu_policy(InvalidationMode::Deferred, FaultPolicy::Stall)
        .unwrap();
    let mode = |id: u32| {
        t.s.conn
            .get_attr(&format!("dev0/queues/q{id}/iommu/mode"))
            .unwrap()
    };
    assert_eq!(mode(t.fresh.id()), "strict");
    assert_ne!(t.stale.id(), t.fresh.id());
    assert_eq!(mode(t.stale.id()), "deferred");
    t.fresh_is_untouched();
}

/// A queue made while another caller reconnects carries the epoch of the
/// connection that made it: it was stamped with the epoch read after its
/// request returned, so one made on the old connection could carry the
/// new epoch and send its id there (where it names nothing, or another
/// queue). Each queue of the current epoch must be usable.
#[test]
fn a_queue_made_while_another_caller_reconnects_carries_its_own_epoch() {
    let dir = tempdir("wd-epoch-race");
    let socket = dir.join("wd.sock");
    let _host = wd_host::Host::start(&HostConfig {
        socket: socket.clone(),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::new("dummy")],
        ..HostConfig::default()
    })
    .expect("host starts");
    let conn = HostConn::connect(&socket).unwrap();
    let mut bad = Vec::new();
    for trial in 0..200u64 {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, s) = (conn.clone(), stop.clone());
        let requester = std::thread::spawn(move || {
            let mut made = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                made.extend(c.request_queue(&Capability::new("memcpy")));
            }
            made
        });
        std::thread::sleep(Duration::from_micros(200 + trial * 37 % 900));
        conn.reconnect(conn.epoch()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let now = conn.epoch();
        for mut q in requester.join().unwrap() {
            if q.epoch() == now {
                if let Err(e) = q.faults(1) {
                    bad.push(format!("trial {trial}: queue {}: {e}", q.id()));
                }
            }
        }
        if bad.len() >= 3 {
            break;
        }
    }
    assert!(
        bad.is_empty(),
        "queues of the current epoch refused: {bad:#?}"
    );
}

/// The descriptor an event loop registered (`wait_fd`) stays the queue's
/// across a restart, on the new queue's doorbell and socket: it was made
/// again, and a loop waited on a closed (or reused) number.
#[test]
fn the_wait_descriptor_survives_a_restart() {
    use std::os::fd::AsRawFd;
    let dir = tempdir("wd-reconnect-waitfd");
    let socket = dir.join("wd.sock");
    let mut host = start_host(&socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn
        .request_queue(&Capability::new("memcpy").depth(4))
        .unwrap();
    let before = q.wait_fd().unwrap().as_raw_fd();
    kill(&mut host);
    let _new = start_host(&socket);
    q.call(Desc::default()).unwrap();
    assert_eq!(q.recovery_stats().reconnects, 1);
    assert_eq!(q.wait_fd().unwrap().as_raw_fd(), before);
    // It wakes for the new queue's completions.
    q.send(Desc::default(), 5).unwrap();
    if !q.arm_wait().unwrap() {
        let ready = wd_sys::poll(&[q.wait_fd().unwrap()], Some(Duration::from_secs(5))).unwrap();
        assert!(ready[0].readable, "woken by the completion");
    }
    wait_until("the completion", || q.completions_ready());
    assert_eq!(q.recv().unwrap().map(|c| c.cookie), Some(5));
}

/// docs/operations.md / DESIGN.md: after the host went away "the client
/// library connects again to the same address ... asks for each queue
/// again ... as it is next used". Two queues of one connection, two
/// restarts: the second queue, remade on the first restart, moved the
/// connection on; the first, still of the oldest connection, asked
/// `HostConn::reconnect` with its old epoch, was handed the (dead) second
/// connection as "already reconnected", and failed with HostGone on
/// every use although a host served again.
#[test]
fn a_queue_of_an_older_connection_comes_back_after_two_restarts() {
    let Setup {
        _dir,
        socket,
        host: mut a,
        conn,
    } = setup("wd-older-conn");
    let mut q1 = conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    let mut q2 = conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    // Copies may be sent again to a restarted host (no-ops too).
    q1.set_redo_policy(wd_dummy_msg::redo_safe);
    q2.set_redo_policy(wd_dummy_msg::redo_safe);
    let nop = Desc::default();
    assert_eq!(q1.call(nop).unwrap().status, 0);
    assert_eq!(q2.call(nop).unwrap().status, 0);

    // First restart: q2 is used and comes back (connection epoch 1).
    kill(&mut a);
    let mut b = start_host(&socket);
    assert_eq!(q2.call(nop).unwrap().status, 0);
    assert_eq!(q2.epoch(), 1);

    // Second restart: q1, still of epoch 0, is used first.
    kill(&mut b);
    let mut c = start_host(&socket);
    let r = q1.call(nop);
    assert!(
        matches!(&r, Ok(d) if d.status == 0),
        "q1 after the second restart: {r:?} (a host serves again at the same address)"
    );
    assert_eq!(q2.call(nop).unwrap().status, 0);
    kill(&mut c);
}

/// A queue whose wait descriptor `signal` made readable (a kick, a hold)
/// before its host was killed, then reconnected to a new host (returned,
/// with its directory, to kill at the end).
fn signalled_then_reconnected(
    name: &str,
    signal: impl FnOnce(&mut wrapdrive::Queue) -> wrapdrive::Result<()>,
) -> (TempDir, Role, wrapdrive::Queue) {
    let Setup {
        _dir,
        socket,
        host: mut a,
        conn,
    } = setup(name);
    let mut q = conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    assert_eq!(q.call(Desc::default()).unwrap().status, 0);
    q.wait_fd().unwrap();
    signal(&mut q).unwrap();
    kill(&mut a);
    let b = start_host(&socket);
    q.reconnect().unwrap();
    (_dir, b, q)
}

/// `Queue::kick_wait` writes a private eventfd kept in the wait set across
/// a reconnect; the reconnect forgot that it may hold a signal
/// (`wait_signalled = false`) but left it unread: the queue's wait
/// descriptor stayed readable for ever after, and an event loop waiting
/// on it for a completion spun.
#[test]
fn a_kick_before_a_reconnect_does_not_leave_the_wait_fd_readable() {
    let (_dir, mut b, mut q) = signalled_then_reconnected("wd-kick", |q| q.kick_wait());

    // An event loop's round: announce, wake, withdraw. Nothing is in
    // flight and nothing completes: the descriptor must go quiet.
    let _ = q.arm_wait().unwrap();
    q.disarm_wait();
    assert!(!q.arm_wait().unwrap());
    let fd = q.wait_fd().unwrap();
    let ready = wd_sys::poll(&[fd], Some(Duration::from_millis(200))).unwrap();
    let readable = ready[0].readable;
    q.disarm_wait();
    kill(&mut b);
    assert!(
        !readable,
        "the wait descriptor is readable with no completion and no kick since the reconnect (a kick from before it was never taken)"
    );
}

/// A hold (`Queue::hold_wait_readable`) survives a reconnect: the wait
/// descriptor stays readable through the reconnect, an event loop's round
/// and a synchronous call, and goes quiet once the hold is given back and
/// the loop withdraws.
#[test]
fn a_hold_survives_a_reconnect_and_is_given_back() {
    let (_dir, mut b, mut q) = signalled_then_reconnected("wd-hold", |q| q.hold_wait_readable());
    let readable = |q: &mut wrapdrive::Queue| {
        let fd = q.wait_fd().unwrap();
        wd_sys::poll(&[fd], Some(Duration::from_millis(100))).unwrap()[0].readable
    };
    let _ = q.arm_wait().unwrap();
    q.disarm_wait();
    let after_round = readable(&mut q);
    assert_eq!(q.call(Desc::default()).unwrap().status, 0);
    let after_call = readable(&mut q);
    // A release without a hold does not go below zero.
    q.release_wait_readable();
    q.release_wait_readable();
    q.disarm_wait();
    let _ = q.arm_wait().unwrap();
    q.disarm_wait();
    let after_release = readable(&mut q);
    kill(&mut b);
    assert!(
        after_round,
        "held: readable after the reconnect and a round"
    );
    assert!(after_call, "held: readable after a synchronous call");
    assert!(!after_release, "given back and withdrawn: quiet");
}
