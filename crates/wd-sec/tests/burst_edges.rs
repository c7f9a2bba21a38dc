//! Bursts at their edges: a request that is not gathered and reads a
//! burst request's output through another IOVA (the same memory shared
//! twice) waits for the burst, as one naming the same IOVA does; many
//! short requests in one burst still finish in their first round.

mod common;

use common::{cipher, data, mb_engine, mem, openssl_crypt, session, Mem, BASE};
use openssl::symm::Cipher;
use wd_device::{Access, DeviceQueue, DeviceSlice, Dma, Fault, HeldSlice, Started};
use wd_sec::msg::{F_ENCRYPT, F_IV};
use wd_sec::{Alg, SecQueue, TYPE_CIPHER};

const MIB: usize = 1 << 20;
/// A second IOVA window onto the flat memory at `BASE`.
const ALIAS: u64 = 0x1000_0000;

/// Flat memory, also reachable at `ALIAS + (iova - BASE)`.
struct Aliased<'a>(&'a mut Mem);

fn tr(iova: u64) -> u64 {
    if iova >= ALIAS {
        iova - ALIAS + BASE
    } else {
        iova
    }
}

impl Dma<'static> for Aliased<'_> {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        self.0.copy(tr(dst), tr(src), len)
    }
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.0.read(tr(src), buf)
    }
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        self.0.write(tr(dst), data)
    }
    fn slice(&mut self, iova: u64, len: u64, access: Access) -> Option<DeviceSlice<'static>> {
        self.0.slice(tr(iova), len, access)
    }
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        self.0.probe(tr(iova), len, access)
    }
    fn hold(&mut self, iova: u64, len: u64, access: Access) -> Option<HeldSlice> {
        self.0.hold(tr(iova), len, access)
    }
}

#[test]
fn a_decryption_reading_a_burst_output_through_an_alias_waits() {
    let Some(e) = mb_engine("a_decryption_reading_a_burst_output_through_an_alias_waits") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(4 << 20, true);
    let key = [9u8; 16];
    let iv = [7u8; 16];
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    let s0 = session(&mut q, &mut mem, alg, &key);
    let s1 = session(&mut q, &mut mem, alg, &key);
    let plain = data(MIB, 1);
    let (src, a, w) = (
        BASE + 0x1_0000,
        BASE + 0x20_0000,
        BASE + 0x10_0000 + 0x8_0000,
    );
    mem.put(src, &plain);
    mem.put(a, &vec![0xee; MIB]);
    let expected = openssl_crypt(Cipher::aes_128_cbc(), &key, Some(&iv), &plain, true);
    let mut done = Vec::new();
    // The 1 MiB encryption: held, a first round runs.
    let mut d = cipher(s0, F_ENCRYPT | F_IV, src, a, MIB, &iv).encode();
    let st = q.start(0, &mut d, &mut Aliased(&mut mem));
    assert_eq!(st, Started::Held);
    q.poll(&mut done);
    // The last 4 KiB of its output, decrypted through the alias.
    let tail = MIB - 4096;
    let div = &expected[tail - 16..tail];
    let mut dd = cipher(s1, F_IV, ALIAS + (a - BASE) + tail as u64, w, 4096, div).encode();
    let mut waited = 0;
    loop {
        let st = q.start(1, &mut dd, &mut Aliased(&mut mem));
        match st {
            Started::Later => {
                waited += 1;
                q.poll(&mut done);
                assert!(waited < 1000);
            }
            Started::Done => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(dd.status, 0);
    while q.in_flight() > 0 {
        q.poll(&mut done);
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1.status, 0);
    assert!(mem.get(a, MIB) == expected, "the encryption");
    assert!(
        mem.get(w, 4096) == plain[tail..],
        "the decryption read the burst's output before the burst wrote it (waited {waited})"
    );
}

/// Requests up to 64 KiB finish in the round that starts them (mb.rs's
/// and docs/sec-device.md's promise, "as they did before"), however many
/// share the burst: the engine hands a queue up to 32 requests a pass.
#[test]
fn thirty_two_requests_of_64_kib_finish_in_their_first_round() {
    let Some(e) = mb_engine("thirty_two_requests_of_64_kib_finish_in_their_first_round") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(8 << 20, true);
    let key = [5u8; 16];
    let iv = [3u8; 16];
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    const N: usize = 32;
    const LEN: usize = 64 << 10;
    let s: Vec<u64> = (0..N)
        .map(|_| session(&mut q, &mut mem, alg, &key))
        .collect();
    let plain = data(LEN, 2);
    let src = BASE + 0x1_0000;
    mem.put(src, &plain);
    let dst = |i: usize| BASE + 0x20_0000 + (i * LEN) as u64;
    q.batch(N);
    for (i, &session) in s.iter().enumerate() {
        let mut d = cipher(session, F_ENCRYPT | F_IV, src, dst(i), LEN, &iv).encode();
        assert_eq!(q.start(i as u64, &mut d, &mut mem), Started::Held);
    }
    let mut done = Vec::new();
    q.poll(&mut done);
    assert_eq!(done.len(), N, "64 KiB requests left to a later round");
    let expected = openssl_crypt(Cipher::aes_128_cbc(), &key, Some(&iv), &plain, true);
    for (t, d) in &done {
        assert_eq!(d.status, 0);
        assert!(mem.get(dst(*t as usize), LEN) == expected);
    }
}
