//! A controller brought up again after its host restarted on the same
//! socket: the same namespaces attached, the same I/O queues created on
//! the same memory, commands in flight sent again, and the data on the
//! store what the commands wrote.
#![allow(unsafe_code)]

use std::os::unix::fs::FileExt;
use std::time::Duration;

use wd_host::{DeviceConfig, Host, HostConfig};
use wd_nvme_driver::msg::IoOp;
use wd_nvme_driver::{Controller, Options};
use wd_testutil::tempdir;
use wrapdrive::{HostConn, SharedBuf};

const BLOCK: u64 = 4096;

fn host(socket: &str, store: &str) -> Host {
    let _ = std::fs::remove_file(socket);
    host_with(socket, store, "")
}

/// A host with `extra` device settings (`key=value,`).
fn host_with(socket: &str, store: &str, extra: &str) -> Host {
    let spec = format!("nvme:engine=sync,{extra}ns={store}:0:4M,ns={store}:4M:4M");
    Host::start(&HostConfig {
        socket: socket.to_string(),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::parse_spec(&spec).unwrap()],
        ..HostConfig::default()
    })
    .expect("host starts")
}

/// A host process (this binary re-run in the role "host"), whose engine
/// sleeps as soon as it is idle: killing it leaves a doorbell that must
/// wake it.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host") {
        return;
    }
    let store = std::env::var("WD_TEST_STORE").unwrap();
    let _h = host_with(&wd_testutil::role_socket(), &store, "idle_spin_us=0,");
    wd_testutil::while_parent_lives();
}

#[test]
fn a_controller_comes_back_with_its_queues_and_commands_in_flight() {
    for shadow in [true, false] {
        let dir = tempdir("wd-nvme-reconnect");
        let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
        std::fs::write(&store, b"").unwrap();
        let first = host(&socket, &store);
        let conn = HostConn::connect(&socket).unwrap();
        let mut c = Controller::open(
            &conn,
            &Options {
                shadow_doorbells: shadow,
            },
        )
        .unwrap();
        let ns = c.open_namespace(2).unwrap();
        let mut q = c.create_io_queue(8).unwrap();
        let buf = SharedBuf::new(64 << 10).unwrap();
        c.share(&buf).unwrap();
        buf.write(0, &[0x11; BLOCK as usize]);
        q.write(&ns, 0, &buf, 0, BLOCK).unwrap();
        // Commands written to the queue but not yet given to the
        // controller when the host goes: in flight for the driver.
        buf.write(BLOCK, &[0x22; BLOCK as usize]);
        let w = q
            .push_rw(IoOp::Write, &ns, 5, buf.addr() + BLOCK, BLOCK)
            .unwrap();
        let r = q
            .push_rw(IoOp::Read, &ns, 0, buf.addr() + 2 * BLOCK, BLOCK)
            .unwrap();
        first.shutdown();
        let _second = host(&socket, &store);
        // The next synchronous command hears that the host went away, and
        // is not left in flight.
        let e = q.read(&ns, 0, &buf, 3 * BLOCK, BLOCK).unwrap_err();
        assert!(e.host_gone(), "{e}");
        c.reconnect().unwrap();
        assert!(c.active_namespaces().unwrap().contains(&2));
        assert_eq!(c.restore_io_queue(&mut q).unwrap(), 2, "two sent again");
        assert_eq!(c.restore_io_queue(&mut q).unwrap(), 0, "current already");
        for cid in [w, r] {
            let cqe = q.wait_for(cid).unwrap();
            assert!(cqe.status.is_success(), "{cqe:?}");
        }
        let mut got = vec![0u8; BLOCK as usize];
        buf.read(2 * BLOCK, &mut got);
        assert!(got.iter().all(|&b| b == 0x11), "the read ran");
        // The queue goes on, and the store holds each write once, at the
        // namespace's offset.
        q.read(&ns, 5, &buf, 3 * BLOCK, BLOCK).unwrap();
        buf.read(3 * BLOCK, &mut got);
        assert!(got.iter().all(|&b| b == 0x22), "the write ran");
        let f = std::fs::File::open(&store).unwrap();
        f.read_exact_at(&mut got, (4 << 20) + 5 * BLOCK).unwrap();
        assert!(got.iter().all(|&b| b == 0x22));
        assert_eq!(c.queue().recovery_stats().reconnects, 1);
        // More queues can be made, and the old one deleted.
        let q2 = c.create_io_queue(8).unwrap();
        c.delete_io_queue(q2).unwrap();
        c.delete_io_queue(q).unwrap();
        c.shutdown().unwrap();
    }
}

#[test]
fn a_namespace_taken_meanwhile_is_an_error_naming_it() {
    let dir = tempdir("wd-nvme-reconnect-taken");
    let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
    std::fs::write(&store, b"").unwrap();
    let first = host(&socket, &store);
    let conn = HostConn::connect(&socket).unwrap();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    c.open_namespace(1).unwrap();
    first.shutdown();
    let _second = host(&socket, &store);
    // Another client gets there first.
    let other = HostConn::connect(&socket).unwrap();
    let mut thief = Controller::open(&other, &Options::default()).unwrap();
    thief.open_namespace(1).unwrap();
    let e = c.reconnect().unwrap_err();
    assert!(e.to_string().contains("namespace attach 1"), "{e}");
}

/// A flush (any command run through the synchronous helpers other than
/// read/write/compare) that fails because the host went away is told to
/// the caller, who runs it again; the driver does not also keep it in
/// flight and send it again on `restore_io_queue` (its completion had no
/// taker and its command slot was lost for good).
#[test]
fn a_flush_that_saw_the_host_go_is_not_sent_again() {
    let dir = tempdir("wd-nvme-flush-restart");
    let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
    std::fs::write(&store, b"").unwrap();
    let first = host(&socket, &store);
    a_failed_flush_across(&socket, || {
        first.shutdown();
        host(&socket, &store)
    });
}

/// The same when it is the doorbell that finds the host gone (its engine
/// was asleep): the command was kept in flight, sent again by
/// `restore_io_queue`, and its id lost.
#[test]
fn a_flush_whose_doorbell_saw_the_host_go_is_not_sent_again() {
    let dir = tempdir("wd-nvme-ring-restart");
    let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
    std::fs::write(&store, b"").unwrap();
    std::env::set_var("WD_TEST_STORE", &store);
    let mut first = wd_testutil::Role::serving("host", &socket);
    a_failed_flush_across(&socket, || {
        // The engine goes to sleep and asks for a wake-up.
        std::thread::sleep(Duration::from_millis(500));
        first.child.kill().unwrap();
        first.child.wait().unwrap();
        wd_testutil::Role::serving("host", &socket)
    });
}

/// A flush, then `restart` (which takes the host on `socket` away and
/// returns the one started there again); the next flush is `HostGone`,
/// leaves nothing in flight and its id free, and is not sent again when
/// the queue is restored.
fn a_failed_flush_across<H>(socket: &str, restart: impl FnOnce() -> H) {
    let conn = HostConn::connect(socket).unwrap();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    let ns = c.open_namespace(1).unwrap();
    let mut q = c.create_io_queue(8).unwrap();
    q.flush(&ns).unwrap();
    let _second = restart();
    let e = q.flush(&ns).unwrap_err();
    assert!(e.host_gone(), "{e}");
    let after = (q.pair().in_flight(), q.pair().room());
    c.reconnect().unwrap();
    let resent = c.restore_io_queue(&mut q).unwrap();
    q.flush(&ns).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    q.flush(&ns).unwrap();
    assert_eq!(
        (after, resent, q.pair().room()),
        ((0, 7), 0, 7),
        "((in flight, room) after the failed flush, commands sent again, free command slots)"
    );
}

/// An admin command that fails because the host went away gives its
/// command id back (after 31 such restarts the admin queue had no id left
/// and the controller could not be brought up again).
#[test]
fn admin_commands_cut_by_host_restarts_do_not_use_up_the_admin_queue() {
    let dir = tempdir("wd-nvme-admin-restarts");
    let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
    std::fs::write(&store, b"").unwrap();
    let mut h = host(&socket, &store);
    let conn = HostConn::connect(&socket).unwrap();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    c.open_namespace(1).unwrap();
    for round in 0..33 {
        h.shutdown();
        h = host(&socket, &store);
        let e = c.active_namespaces().unwrap_err();
        assert!(e.host_gone(), "round {round}: {e}");
        c.reconnect()
            .unwrap_or_else(|e| panic!("round {round}: reconnect: {e}"));
    }
    assert!(c.active_namespaces().unwrap().contains(&1));
}

/// An Identify given up while its host was stopped, then a namespace
/// attachment sent before the host runs again: the controller runs both
/// in order, the late Identify first. Its data must not land on the
/// attachment's controller list (both went through the one scratch page,
/// so the attachment named controllers out of Identify data).
#[test]
fn a_given_up_identify_does_not_overwrite_the_next_commands_data() {
    let dir = tempdir("wd-nvme-late-identify");
    let (socket, store) = (dir.join("wd.sock"), dir.join("store.img"));
    std::fs::write(&store, b"").unwrap();
    std::env::set_var("WD_TEST_STORE", &store);
    let host = wd_testutil::Role::serving("host", &socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    c.open_namespace(1).unwrap();
    let pid = host.pid();
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    wd_testutil::wait_stopped(pid);
    let e = c.identify(0x01, 0).unwrap_err();
    assert!(matches!(e, wd_nvme_driver::NvmeError::Timeout(_)), "{e}");
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    let attached = c.attach(2);
    resume.join().unwrap();
    attached.unwrap();
    assert_eq!(c.active_namespaces().unwrap(), vec![1, 2]);
}
