//! A whole mediated NVMe controller driven by a hostile client: register
//! writes (CC, AQA, ASQ/ACQ, doorbells), writes into its memory (queues,
//! PRP lists, data) and engine passes, in any order. The controller must
//! never panic, never reach outside the client's memory (the flat memory
//! faults there) and keep answering.
#![no_main]
use std::os::fd::AsFd;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use wd_device::{Driver, Registers};
use wd_nvme::msg::regs;
use wd_nvme::{IoEngine, NvmeDriver};
use wd_testutil::dma::FlatMemory;

const BASE: u64 = 0x10_0000;
const MEM: usize = 64 * 1024;

fn driver() -> &'static NvmeDriver {
    static D: OnceLock<NvmeDriver> = OnceLock::new();
    D.get_or_init(|| {
        let store = std::env::temp_dir().join(format!("wd-fuzz-nvme-{}.img", std::process::id()));
        let _ = std::fs::write(&store, b"");
        let s = store.display();
        NvmeDriver::new(
            &[format!("{s}:0:1M"), format!("{s}:1M:1M:512")],
            IoEngine::Sync,
        )
        .expect("namespaces")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut ctl = driver().open_queue(0);
    let fd = wd_sys::memfd_create("regs", false).unwrap();
    wd_sys::ftruncate(fd.as_fd(), regs::BLOCK_BYTES as u64).unwrap();
    let map = Arc::new(wd_sys::Mapping::map_shared(fd.as_fd(), 0, regs::BLOCK_BYTES).unwrap());
    let r = Registers::new(map, 0, regs::BLOCK_BYTES).unwrap();
    ctl.attach_registers(r.clone());
    let mut mem = FlatMemory::new(BASE, MEM);
    let mut i = 0;
    while i < data.len() {
        let op = data[i];
        i += 1;
        let arg = |i: &mut usize, n: usize| -> u64 {
            let mut v = 0u64;
            for k in 0..n {
                v |= (*data.get(*i + k).unwrap_or(&0) as u64) << (8 * k);
            }
            *i += n;
            v
        };
        match op % 6 {
            // A register: CC, AQA, ASQ, ACQ or a doorbell.
            0 => {
                let which = arg(&mut i, 1) as usize % 5;
                let v = arg(&mut i, 4) as u32;
                match which {
                    0 => r.store32(regs::CC, v),
                    1 => r.store32(regs::AQA, v),
                    2 => r.store64(regs::ASQ, BASE + (v as u64 % MEM as u64)),
                    3 => r.store64(regs::ACQ, BASE + (v as u64 % MEM as u64)),
                    _ => r.store32(regs::DOORBELLS + 4 * (v as usize % 34), v >> 8),
                }
            }
            // Bytes into the client's memory (entries, lists, data).
            1 | 2 => {
                let at = arg(&mut i, 2) % MEM as u64;
                let want = arg(&mut i, 1) as usize;
                let from = i.min(data.len());
                let n = want.min(data.len() - from).min(MEM - at as usize);
                mem.put(BASE + at, &data[from..from + n]);
                i = from + n;
            }
            // A well-formed enable, so the rest of the input reaches the
            // command loop.
            3 => {
                r.store32(regs::CC, 0);
                ctl.service(&mut mem);
                r.store32(regs::AQA, regs::aqa_encode(16, 16));
                r.store64(regs::ASQ, BASE);
                r.store64(regs::ACQ, BASE + 0x1000);
                r.store32(regs::CC, 1 | 6 << 16 | 4 << 20);
            }
            4 => {
                let _ = ctl.prepare_sleep();
            }
            _ => {
                ctl.service(&mut mem);
            }
        }
        ctl.service(&mut mem);
    }
    ctl.quiesce();
});
