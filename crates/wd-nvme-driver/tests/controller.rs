//! The mediated controller through this driver and a host in this process
//! (clients in child processes where a test kills one): bring-up, the
//! spec's command and queue rules, data against `pread` of the store, and
//! isolation between clients sharing one store.

use std::os::unix::fs::FileExt;

use wd_nvme_driver::msg::{AdminOp, IoOp, Sqe, Status};
use wd_nvme_driver::{Controller, Options};
use wrapdrive::SharedBuf;

mod common;
use common::{start, status_of};

#[test]
fn bring_up_identify_and_round_trip() {
    let h = start(&["0:16M", "16M:16M:512"]);
    let conn = h.conn();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    assert_eq!(c.info().nn, 2);
    assert!(c.info().model.contains("WrapDrive"));
    assert_eq!(c.allocated_namespaces().unwrap(), vec![1, 2]);
    assert!(c.active_namespaces().unwrap().is_empty());
    let ns = c.open_namespace(2).unwrap();
    assert_eq!((ns.block, ns.blocks), (512, 32768));
    assert_eq!(c.active_namespaces().unwrap(), vec![2]);
    let mut q = c.create_io_queue(64).unwrap();
    let buf = SharedBuf::new(1 << 20).unwrap();
    c.share(&buf).unwrap();
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    buf.write(0, &data);
    // 256 KiB through a PRP list, at an offset inside the buffer.
    q.write(&ns, 10, &buf, 0, data.len() as u64).unwrap();
    let f = std::fs::File::open(h.store()).unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, (16 << 20) + 10 * 512).unwrap();
    assert_eq!(back, data, "store holds what was written");
    q.read(&ns, 10, &buf, 4096 + 8, data.len() as u64).unwrap();
    let mut got = vec![0u8; data.len()];
    buf.read(4096 + 8, &mut got);
    assert_eq!(got, data);
    q.compare(&ns, 10, &buf, 4096 + 8, 512).unwrap();
    buf.write(4096 + 8, &[0xff]);
    assert_eq!(
        status_of(q.compare(&ns, 10, &buf, 4096 + 8, 512)),
        Status::COMPARE_FAILURE
    );
    q.write_zeroes(&ns, 10, 8, false).unwrap();
    q.read(&ns, 10, &buf, 0, 4096).unwrap();
    let mut z = vec![1u8; 4096];
    buf.read(0, &mut z);
    assert!(z.iter().all(|&b| b == 0));
    q.flush(&ns).unwrap();
    // SMART counts what moved.
    let smart = c.log_page(0x02, 512).unwrap();
    let reads = u64::from_le_bytes(smart[64..72].try_into().unwrap());
    let writes = u64::from_le_bytes(smart[80..88].try_into().unwrap());
    assert!(reads >= 3 && writes >= 2, "reads {reads} writes {writes}");
    c.delete_io_queue(q).unwrap();
    c.shutdown().unwrap();
}

#[test]
fn command_and_queue_errors_have_the_spec_status() {
    let h = start(&["0:4M"]);
    let conn = h.conn();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    let ns = c.open_namespace(1).unwrap();
    let mut q = c.create_io_queue(8).unwrap();
    let buf = SharedBuf::new(8192).unwrap();
    c.share(&buf).unwrap();
    // Outside the namespace.
    assert_eq!(
        status_of(q.read(&ns, ns.blocks - 1, &buf, 0, 8192)),
        Status::LBA_OUT_OF_RANGE
    );
    // An unknown namespace, an unknown opcode.
    let bad_ns = wd_nvme_driver::Namespace { nsid: 9, ..ns };
    assert_eq!(
        status_of(q.read(&bad_ns, 0, &buf, 0, 4096)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        status_of(q.run(
            "opcode 0x7f",
            Sqe {
                opcode: 0x7f,
                nsid: 1,
                ..Sqe::default()
            }
        )),
        Status::INVALID_OPCODE
    );
    // Memory never shared: a data transfer error, and an IOMMU fault.
    let private = SharedBuf::new(4096).unwrap();
    assert_eq!(
        status_of(q.read(&ns, 0, &private, 0, 4096)),
        Status::DATA_TRANSFER_ERROR
    );
    assert!(c.queue().faults(16).unwrap().total >= 1);
    // PRP2 not page aligned for a two-page transfer.
    let mut sqe = Sqe {
        opcode: IoOp::Read as u8,
        nsid: 1,
        prp1: buf.addr(),
        prp2: buf.addr() + 4096 + 8,
        ..Sqe::default()
    };
    sqe.cdw[2] = 1;
    assert_eq!(
        status_of(q.run("bad prp2", sqe)),
        Status::PRP_OFFSET_INVALID
    );
    // Queue creation rules.
    let create = |op: AdminOp, qid: u16, entries: u32, other: u16| {
        let mut s = Sqe {
            opcode: op as u8,
            prp1: buf.addr(),
            ..Sqe::default()
        };
        wd_nvme_driver::msg::cmd::CreateQueue {
            qid,
            entries,
            contiguous: true,
            other,
            base: buf.addr(),
        }
        .encode(&mut s);
        s
    };
    assert_eq!(
        status_of(c.admin_command("cq 0", create(AdminOp::CreateCq, 0, 4, 0))),
        Status::INVALID_QUEUE_ID
    );
    assert_eq!(
        status_of(c.admin_command("cq 1 again", create(AdminOp::CreateCq, 1, 4, 0))),
        Status::INVALID_QUEUE_ID
    );
    assert_eq!(
        status_of(c.admin_command("cq of 1 entry", create(AdminOp::CreateCq, 2, 1, 0))),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        status_of(c.admin_command("sq on missing cq", create(AdminOp::CreateSq, 2, 4, 5))),
        Status::CQ_INVALID
    );
    let delete_cq = Sqe {
        opcode: AdminOp::DeleteCq as u8,
        cdw: [1, 0, 0, 0, 0, 0],
        ..Sqe::default()
    };
    assert_eq!(
        status_of(c.admin_command("delete busy cq", delete_cq)),
        Status::INVALID_QUEUE_DELETION
    );
    // A second Number of Queues after I/O queues exist.
    let nq = Sqe {
        opcode: AdminOp::SetFeatures as u8,
        cdw: [7, 0, 0, 0, 0, 0],
        ..Sqe::default()
    };
    assert_eq!(
        status_of(c.admin_command("number of queues again", nq)),
        Status::SEQUENCE_ERROR
    );
    // The error log has them, newest first.
    let log = c.log_page(0x01, 64).unwrap();
    let count = u64::from_le_bytes(log[0..8].try_into().unwrap());
    assert!(count >= 9, "error count {count}");
}

#[test]
fn two_clients_on_one_store_stay_in_their_namespaces() {
    let h = start(&["0:4M", "4M:4M"]);
    let (ca, cb) = (h.conn(), h.conn());
    let mut a = Controller::open(&ca, &Options::default()).unwrap();
    let mut b = Controller::open(
        &cb,
        &Options {
            shadow_doorbells: false,
        },
    )
    .unwrap();
    let na = a.open_namespace(1).unwrap();
    let nb = b.open_namespace(2).unwrap();
    // A namespace is private to one controller.
    assert_eq!(status_of(b.attach(1)), Status::NS_IS_PRIVATE);
    let mut qa = a.create_io_queue(16).unwrap();
    let mut qb = b.create_io_queue(16).unwrap();
    let (ba, bb) = (SharedBuf::new(4096).unwrap(), SharedBuf::new(4096).unwrap());
    a.share(&ba).unwrap();
    b.share(&bb).unwrap();
    ba.write(0, &[0xaa; 4096]);
    bb.write(0, &[0xbb; 4096]);
    qa.write(&na, 0, &ba, 0, 4096).unwrap();
    qb.write(&nb, 0, &bb, 0, 4096).unwrap();
    // B cannot name A's namespace, nor reach past its own.
    let a_ns_from_b = wd_nvme_driver::Namespace { nsid: 1, ..nb };
    assert_eq!(
        status_of(qb.read(&a_ns_from_b, 0, &bb, 0, 4096)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        status_of(qb.read(&nb, nb.blocks, &bb, 0, 4096)),
        Status::LBA_OUT_OF_RANGE
    );
    // B's buffer is not in A's domain.
    assert_eq!(
        status_of(qa.read(&na, 0, &bb, 0, 4096)),
        Status::DATA_TRANSFER_ERROR
    );
    let f = std::fs::File::open(h.store()).unwrap();
    let mut x = [0u8; 4096];
    f.read_exact_at(&mut x, 0).unwrap();
    assert!(x.iter().all(|&v| v == 0xaa));
    f.read_exact_at(&mut x, 4 << 20).unwrap();
    assert!(x.iter().all(|&v| v == 0xbb));
    // A's queue is not B's to delete (B deleted its own queue of that id).
    assert_eq!(qa.qid(), qb.qid());
    assert!(matches!(
        b.delete_io_queue(qa),
        Err(wd_nvme_driver::NvmeError::Invalid(_))
    ));
    qb.write(&nb, 0, &bb, 0, 4096).unwrap();
    // When A goes, its namespace is free again.
    drop(a);
    drop(ca);
    wd_testutil::wait_until("namespace 1 released", || b.attach(1).is_ok());
}
