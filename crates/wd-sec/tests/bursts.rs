//! Multi-buffer bursts of large CBC encryptions run in rounds, one per
//! poll, so the engine serves its other queues between them: the bytes
//! against OpenSSL's single stream, what one poll does, the order of a
//! session's requests and of requests meeting a burst's memory, and
//! teardown in the middle of a burst.

mod common;

use std::collections::{HashMap, VecDeque};

use common::{cipher, data, mb_engine, mem, openssl_crypt, run_in_pieces, session, Mem, BASE};
use openssl::symm::Cipher;
use wd_device::{status, DeviceQueue, Started};
use wd_ring::Desc;
use wd_sec::msg::{F_ENCRYPT, F_IV};
use wd_sec::{Alg, SecQueue, TYPE_CIPHER};

const MIB: usize = 1 << 20;
/// What a round encrypts of each request of a burst of up to 16.
const LANE: usize = 64 << 10;
/// What the device's memory holds where it has not written.
const UNTOUCHED: u8 = 0xee;

fn openssl_cbc(key: &[u8]) -> Cipher {
    match key.len() {
        16 => Cipher::aes_128_cbc(),
        24 => Cipher::aes_192_cbc(),
        _ => Cipher::aes_256_cbc(),
    }
}

fn cbc(key: &[u8]) -> Alg {
    Alg::by_name(&format!("aes-{}-cbc", key.len() * 8)).unwrap()
}

/// A CBC encryption sent in parts: its session, key, IV and plaintext,
/// and each part's source, destination and length.
struct Message {
    session: u64,
    key: Vec<u8>,
    iv: [u8; 16],
    plain: Vec<u8>,
    placed: Vec<(u64, u64, usize)>,
}

impl Message {
    /// `plain` laid out from `*at` in parts of `lens`, each part's
    /// source written; `layout(j)` says whether part `j` is encrypted in
    /// place and how many bytes to leave after it.
    fn place(
        mem: &mut Mem,
        at: &mut u64,
        (session, key, iv): (u64, Vec<u8>, [u8; 16]),
        plain: Vec<u8>,
        lens: &[usize],
        mut layout: impl FnMut(usize) -> (bool, u64),
    ) -> Message {
        let mut placed = Vec::new();
        let mut off = 0;
        for (j, &n) in lens.iter().enumerate() {
            let (in_place, gap) = layout(j);
            let src = *at;
            let dst = if in_place { src } else { src + n as u64 };
            mem.put(src, &plain[off..off + n]);
            placed.push((src, dst, n));
            *at += 2 * n as u64 + gap;
            off += n;
        }
        Message {
            session,
            key,
            iv,
            plain,
            placed,
        }
    }

    /// The request of part `j` (the first brings the IV).
    fn part(&self, j: usize) -> Desc {
        let (src, dst, n) = self.placed[j];
        let flags = if j == 0 { F_ENCRYPT | F_IV } else { F_ENCRYPT };
        cipher(self.session, flags, src, dst, n, &self.iv).encode()
    }

    /// What its parts' destinations hold.
    fn output(&self, mem: &Mem) -> Vec<u8> {
        self.placed
            .iter()
            .flat_map(|&(_, dst, n)| mem.get(dst, n))
            .collect()
    }

    /// OpenSSL's encryption of its plaintext, then of `more`.
    fn openssl(&self, more: &[u8]) -> Vec<u8> {
        let plain = [&self.plain[..], more].concat();
        openssl_crypt(
            openssl_cbc(&self.key),
            &self.key,
            Some(&self.iv),
            &plain,
            true,
        )
    }
}

/// An engine's passes over one asynchronous queue: each hands the queue
/// the requests waiting on its ring (as many as the engine takes in a
/// pass), in order, until one must wait (it and those after it stay for
/// the next pass), then polls it once.
#[derive(Default)]
struct Passes {
    waiting: VecDeque<(u64, Desc)>,
    /// Each completed request: the pass it completed in, and how.
    done: HashMap<u64, (usize, Desc)>,
    /// Passes that handed a request back (`Started::Later`).
    waited: HashMap<u64, usize>,
    /// Requests the queue held.
    held: usize,
    passes: usize,
}

impl Passes {
    fn submit(&mut self, token: u64, d: Desc) {
        self.waiting.push_back((token, d));
    }

    fn pass(&mut self, q: &mut SecQueue, mem: &mut Mem) {
        self.passes += 1;
        let mut left = self.waiting.len().min(32);
        if left > 0 {
            q.batch(left);
        }
        while let Some(&(t, d)) = self.waiting.front().filter(|_| left > 0) {
            let mut d = d;
            match q.start(t, &mut d, mem) {
                Started::Done => self.complete(t, d),
                Started::Held => self.held += 1,
                Started::Cut => {
                    let d = run_in_pieces(q, mem, d, 256 << 10).0;
                    self.complete(t, d)
                }
                Started::Later => {
                    *self.waited.entry(t).or_default() += 1;
                    break;
                }
            }
            self.waiting.pop_front();
            left -= 1;
        }
        let mut out = Vec::new();
        q.poll(&mut out);
        for (t, d) in out {
            self.complete(t, d);
        }
    }

    fn complete(&mut self, t: u64, d: Desc) {
        assert!(
            self.done.insert(t, (self.passes, d)).is_none(),
            "request {t} completed twice"
        );
    }

    /// Passes until everything submitted has completed.
    fn run(&mut self, q: &mut SecQueue, mem: &mut Mem) {
        while !self.waiting.is_empty() || q.in_flight() > 0 {
            self.pass(q, mem);
            assert!(self.passes < 10_000, "requests never complete");
        }
    }

    fn status(&self, t: u64) -> i32 {
        self.done[&t].1.status
    }

    fn pass_of(&self, t: u64) -> usize {
        self.done[&t].0
    }
}

/// Messages of every key size, each continued over several requests of
/// up to 1 MiB (in place and not), sent all at once: a message's next
/// part waits for the part before it, which goes on over rounds, then
/// runs in a later burst; a part left alone runs on libcrypto and one
/// continued from there joins a burst again. The bytes are OpenSSL's, and
/// no 1 MiB request finished in the pass that started it.
#[test]
fn bursts_of_1_mib_requests_over_rounds_match_openssl() {
    let Some(e) = mb_engine("bursts_of_1_mib_requests_over_rounds_match_openssl") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(40 << 20, true);
    let keys: Vec<Vec<u8>> = (0..6)
        .map(|k| vec![k as u8 + 1; [16, 24, 32][k % 3]])
        .collect();
    // The last message's last part runs alone (libcrypto, its chain in
    // the session's context) before the next phase's parts join it.
    let parts: Vec<Vec<usize>> = (0..6)
        .map(|k| match k {
            5 => vec![MIB, MIB - 48, 80 << 10, MIB],
            _ => vec![MIB - 16 * k, (80 << 10) + 16, MIB],
        })
        .collect();
    let mut at = BASE + 0x1_0000;
    let mut msgs = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let s = session(&mut q, &mut mem, cbc(key), key);
        let plain = data(parts[k].iter().sum(), k);
        msgs.push(Message::place(
            &mut mem,
            &mut at,
            (s, key.clone(), [k as u8 + 0x40; 16]),
            plain,
            &parts[k],
            |j| ((k + j) % 2 == 0, 4096),
        ));
    }
    let token = |k: usize, j: usize| (k * 10 + j) as u64;
    let send = |p: &mut Passes, k: usize, j: usize| p.submit(token(k, j), msgs[k].part(j));
    let mut p = Passes::default();
    for j in 0..3 {
        for k in 0..6 {
            send(&mut p, k, j);
        }
    }
    p.run(&mut q, &mut mem);
    // The last part alone until a round has run it (it waits a little
    // for company first), then others join it.
    send(&mut p, 5, 3);
    let (_, alone, _) = msgs[5].placed[3];
    let before = mem.get(alone, 16);
    while mem.get(alone, 16) == before {
        p.pass(&mut q, &mut mem);
        assert!(p.passes < 10_000);
    }
    assert!(
        !p.done.contains_key(&token(5, 3)),
        "1 MiB alone in one round"
    );
    let mut tails = Vec::new();
    for (k, m) in msgs.iter().enumerate().take(5) {
        let tail = data(LANE, 100 + k);
        let (tsrc, tdst) = (at, at + tail.len() as u64);
        at += 2 * tail.len() as u64;
        mem.put(tsrc, &tail);
        tails.push((tdst, tail.clone()));
        p.submit(
            token(k, 3),
            cipher(m.session, F_ENCRYPT, tsrc, tdst, tail.len(), &[]).encode(),
        );
    }
    p.run(&mut q, &mut mem);
    for t in p.done.keys() {
        assert_eq!(p.status(*t), 0, "request {t}");
    }
    for (k, m) in msgs.iter().enumerate() {
        for (j, &(_, _, n)) in m.placed.iter().enumerate() {
            if n >= MIB - 16 * 6 {
                assert!(
                    p.pass_of(token(k, j)) > 1,
                    "message {k} part {j}: {n} bytes finished in one pass"
                );
            }
        }
        let mut got = m.output(&mem);
        let mut more = Vec::new();
        if k < 5 {
            let (tdst, tail) = &tails[k];
            got.extend(mem.get(*tdst, tail.len()));
            more.clone_from(tail);
        }
        assert!(
            got == m.openssl(&more),
            "message {k} (AES-{}) differs from OpenSSL's",
            m.key.len() * 8
        );
    }
}

/// A burst of 16 encryptions of 1 MiB: a poll runs one round of it (64 KiB
/// of each, the rest of each output untouched) and returns with all of
/// them unfinished; a short encryption of another session that comes
/// meanwhile joins the next round and finishes in it, and a CTR request
/// runs at once, both before the 1 MiB ones. A burst of requests up to
/// 64 KiB still finishes in the poll that runs it.
#[test]
fn a_burst_gives_the_engine_back_between_rounds() {
    let Some(e) = mb_engine("a_burst_gives_the_engine_back_between_rounds") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(28 << 20, true);
    let iv = [0x33u8; 16];
    let keys: Vec<[u8; 16]> = (0..18).map(|k| [k as u8 + 1; 16]).collect();
    let sessions: Vec<u64> = keys
        .iter()
        .map(|k| session(&mut q, &mut mem, cbc(k), k))
        .collect();
    let ctr = Alg::by_name("aes-128-ctr").unwrap();
    let ctr_session = session(&mut q, &mut mem, ctr, &[9u8; 16]);
    let plain = data(MIB, 1);
    let src = BASE + 0x1_0000;
    mem.put(src, &plain);
    let dst = |k: usize| src + ((k as u64 + 1) << 20);
    let want = |k: usize, n: usize| {
        openssl_crypt(
            Cipher::aes_128_cbc(),
            &keys[k],
            Some(&iv),
            &plain[..n],
            true,
        )
    };

    // Requests of 64 KiB: one round, in the poll that runs it.
    let mut d: Vec<Desc> = (0..16)
        .map(|k| cipher(sessions[k], F_ENCRYPT | F_IV, src, dst(k), LANE, &iv).encode())
        .collect();
    q.batch(16);
    for (k, d) in d.iter_mut().enumerate() {
        assert_eq!(q.start(k as u64, d, &mut mem), Started::Held);
    }
    let mut out = Vec::new();
    q.poll(&mut out);
    assert_eq!(out.len(), 16, "16 x 64 KiB in one poll");
    assert!(out.iter().all(|(_, d)| d.status == 0));
    assert_eq!(mem.get(dst(3), LANE), want(3, LANE));

    // Requests of 1 MiB: a round per poll.
    for k in 0..16 {
        mem.put(dst(k), &vec![UNTOUCHED; MIB]);
    }
    q.batch(16);
    for (k, &s) in sessions.iter().enumerate().take(16) {
        let mut d = cipher(s, F_ENCRYPT | F_IV, src, dst(k), MIB, &iv).encode();
        assert_eq!(q.start(k as u64, &mut d, &mut mem), Started::Held);
    }
    let mut out = Vec::new();
    q.poll(&mut out);
    assert!(out.is_empty(), "16 x 1 MiB finished in one poll");
    assert_eq!(q.in_flight(), 16);
    for k in 0..16 {
        let got = mem.get(dst(k), MIB);
        assert!(
            got[..LANE] == want(k, LANE)[..],
            "request {k}: its first round"
        );
        assert!(
            got[LANE..].iter().all(|&b| b == UNTOUCHED),
            "request {k}: more than a round in one poll"
        );
    }
    // Another session's short encryption joins the burst; a CTR request
    // runs at once.
    let (ssrc, sdst, cdst) = (BASE + 0x180_0000, BASE + 0x180_1000, BASE + 0x180_2000);
    mem.put(ssrc, &plain[..4096]);
    let short = cipher(sessions[16], F_ENCRYPT | F_IV, ssrc, sdst, 4096, &iv).encode();
    let other = cipher(ctr_session, F_ENCRYPT | F_IV, ssrc, cdst, 4096, &iv).encode();
    q.batch(2);
    let mut d = short;
    assert_eq!(q.start(16, &mut d, &mut mem), Started::Held);
    let mut d = other;
    assert_eq!(q.start(17, &mut d, &mut mem), Started::Done);
    assert_eq!(d.status, 0);
    q.poll(&mut out);
    let tokens: Vec<u64> = out.iter().map(|(t, _)| *t).collect();
    assert_eq!(tokens, vec![16], "the short one, before the 1 MiB ones");
    assert_eq!(out[0].1.status, 0);
    assert_eq!(mem.get(sdst, 4096), want(16, 4096));
    out.clear();
    // The rest, a round per poll.
    let mut polls = 0;
    while q.in_flight() > 0 {
        q.poll(&mut out);
        polls += 1;
        assert!(polls < 1000);
    }
    assert!(polls > 1, "the rest of 1 MiB in {polls} polls");
    assert_eq!(out.len(), 16);
    for (k, d) in &out {
        assert_eq!((d.status, d.result), (0, MIB as u64), "request {k}");
        assert!(
            mem.get(dst(*k as usize), MIB) == want(*k as usize, MIB),
            "request {k}"
        );
    }
}

/// Encryptions over 1 MiB of four sessions sent together join one burst
/// (they went to the long path, one at a time on libcrypto's single
/// stream): a poll runs a round of each, 64 KiB side by side, the rest of
/// each output untouched; then a round per poll until all are done, the
/// bytes OpenSSL's, the odd lengths' last rounds short.
#[test]
fn requests_over_1_mib_join_a_burst() {
    let Some(e) = mb_engine("requests_over_1_mib_join_a_burst") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(24 << 20, true);
    let iv = [0x5au8; 16];
    let lens = [3 * MIB, 4 * MIB, MIB + 16, 2 * MIB + 4096];
    let keys: Vec<Vec<u8>> = (0..4)
        .map(|k| vec![k as u8 + 7; [16, 24, 32, 16][k]])
        .collect();
    let sessions: Vec<u64> = keys
        .iter()
        .map(|k| session(&mut q, &mut mem, cbc(k), k))
        .collect();
    let plain = data(4 * MIB, 3);
    let src = BASE + 0x1_0000;
    mem.put(src, &plain);
    let dst = |k: usize| src + ((4 * k as u64 + 4) << 20);
    for (k, &n) in lens.iter().enumerate() {
        mem.put(dst(k), &vec![UNTOUCHED; n]);
    }
    q.batch(4);
    for (k, &s) in sessions.iter().enumerate() {
        let mut d = cipher(s, F_ENCRYPT | F_IV, src, dst(k), lens[k], &iv).encode();
        assert_eq!(q.start(k as u64, &mut d, &mut mem), Started::Held);
    }
    // Fewer than a full burst: it runs once no request came for a while.
    std::thread::sleep(std::time::Duration::from_millis(1));
    let mut out = Vec::new();
    q.poll(&mut out);
    assert!(out.is_empty(), "a request over 1 MiB finished in one poll");
    for (k, &n) in lens.iter().enumerate() {
        let got = mem.get(dst(k), n);
        let want = openssl_crypt(
            openssl_cbc(&keys[k]),
            &keys[k],
            Some(&iv),
            &plain[..LANE],
            true,
        );
        assert!(got[..LANE] == want[..], "request {k}: its first round");
        assert!(
            got[LANE..].iter().all(|&b| b == UNTOUCHED),
            "request {k}: more than a round of a burst in one poll"
        );
    }
    let mut polls = 1;
    while q.in_flight() > 0 {
        q.poll(&mut out);
        polls += 1;
        assert!(polls < 1000);
    }
    // A round runs at most 256 KiB of a request (one left alone).
    assert!(polls >= 4 * MIB / (256 << 10), "4 MiB in {polls} polls");
    assert_eq!(out.len(), 4);
    for (k, d) in &out {
        let k = *k as usize;
        assert_eq!((d.status, d.result), (0, lens[k] as u64), "request {k}");
        let want = openssl_crypt(
            openssl_cbc(&keys[k]),
            &keys[k],
            Some(&iv),
            &plain[..lens[k]],
            true,
        );
        assert!(mem.get(dst(k), lens[k]) == want, "request {k}");
    }
}

/// Teardown in the middle of a burst: a request that finished (and was
/// not reported yet) comes back with its outcome; one a round has run is
/// unfinished, as a long request stopped between pieces is: cancelled,
/// though part of its output is written; one no round has run yet is
/// cancelled untouched. Nothing is held afterwards.
#[test]
fn teardown_in_the_middle_of_a_burst() {
    let Some(e) = mb_engine("teardown_in_the_middle_of_a_burst") else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(8 << 20, true);
    let keys = [[1u8; 16], [2; 16], [3; 16]];
    let iv = [5u8; 16];
    let s: Vec<u64> = keys
        .iter()
        .map(|k| session(&mut q, &mut mem, cbc(k), k))
        .collect();
    let plain = data(MIB, 2);
    let (src, a, b, c) = (
        BASE + 0x1_0000,
        BASE + 0x20_0000,
        BASE + 0x40_0000,
        BASE + 0x60_0000,
    );
    mem.put(src, &plain);
    mem.put(a, &vec![UNTOUCHED; MIB]);
    // b encrypts in place.
    mem.put(b, &plain);
    mem.put(c, &vec![UNTOUCHED; 64 << 10]);
    let reqs = [
        cipher(s[0], F_ENCRYPT | F_IV, src, a, MIB, &iv).encode(),
        cipher(s[1], F_ENCRYPT | F_IV, b, b, MIB, &iv).encode(),
        cipher(s[2], F_ENCRYPT | F_IV, src, c, 32 << 10, &iv).encode(),
    ];
    q.batch(3);
    for (t, d) in reqs.iter().enumerate() {
        let mut d = *d;
        assert_eq!(q.start(t as u64, &mut d, &mut mem), Started::Held);
    }
    // The short message's next part: its first must finish first, which
    // runs the burst's first round; it then joins the burst.
    let next = cipher(
        s[2],
        F_ENCRYPT,
        src + (32 << 10),
        c + (32 << 10),
        16 << 10,
        &[],
    );
    let mut d = next.encode();
    q.batch(1);
    assert_eq!(q.start(3, &mut d, &mut mem), Started::Held);
    let got = common::abort_outcomes(&mut q);
    assert_eq!(
        got,
        vec![
            (0, status::ECANCELED, 0),
            (1, status::ECANCELED, 0),
            (2, 0, 32 << 10),
            (3, status::ECANCELED, 0),
        ]
    );
    assert_eq!(q.in_flight(), 0);
    let mut out = Vec::new();
    q.poll(&mut out);
    assert!(out.is_empty());
    let want = |k: usize, n: usize| {
        openssl_crypt(
            Cipher::aes_128_cbc(),
            &keys[k],
            Some(&iv),
            &plain[..n],
            true,
        )
    };
    // The unfinished ones: one round written, the rest as it was.
    let got_a = mem.get(a, MIB);
    assert!(got_a[..LANE] == want(0, LANE)[..]);
    assert!(got_a[LANE..].iter().all(|&x| x == UNTOUCHED));
    let got_b = mem.get(b, MIB);
    assert!(got_b[..LANE] == want(1, LANE)[..]);
    assert!(got_b[LANE..] == plain[LANE..]);
    // The finished one whole, the untouched one untouched.
    assert_eq!(mem.get(c, 32 << 10), want(2, 32 << 10));
    assert!(mem
        .get(c + (32 << 10), 16 << 10)
        .iter()
        .all(|&x| x == UNTOUCHED));
}

/// While a burst goes on over rounds, a request of one of its sessions
/// waits for that session's request (a decryption, which the multi-buffer
/// path does not gather, and a continuation, which it does), and a request
/// of another session that reads what a burst request writes waits for
/// that request; each runs once what it waits for is finished, before the
/// rest of the burst is, and another session's request on other memory
/// runs at once. The results are OpenSSL's.
#[test]
fn requests_behind_an_unfinished_burst_request_wait_and_run_in_order() {
    let Some(e) = mb_engine("requests_behind_an_unfinished_burst_request_wait_and_run_in_order")
    else {
        return;
    };
    let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
    let mut mem = mem(12 << 20, true);
    let keys = [[1u8; 16], [2; 16], [4; 16]];
    let k3 = [3u8; 16];
    let iv = [7u8; 16];
    let s: Vec<u64> = keys
        .iter()
        .map(|k| session(&mut q, &mut mem, cbc(k), k))
        .collect();
    let ctr = Alg::by_name("aes-128-ctr").unwrap();
    let s3 = session(&mut q, &mut mem, ctr, &k3);
    let s4 = session(&mut q, &mut mem, ctr, &k3);
    let plain = data(MIB + 4096, 3);
    let (src, a, b, c) = (
        BASE + 0x1_0000,
        BASE + 0x20_0000,
        BASE + 0x40_0000,
        BASE + 0x60_0000,
    );
    let (x, y, w) = (BASE + 0x80_0000, BASE + 0x81_0000, BASE + 0x90_0000);
    mem.put(src, &plain);
    // Burst requests of 16, 8 and 12 rounds.
    let lens = [MIB, MIB / 2, 3 * MIB / 4];
    let mut p = Passes::default();
    for (t, (&dst, &n)) in [a, b, c].iter().zip(&lens).enumerate() {
        p.submit(
            t as u64,
            cipher(s[t], F_ENCRYPT | F_IV, src, dst, n, &iv).encode(),
        );
    }
    p.pass(&mut q, &mut mem);
    assert!(p.done.is_empty(), "512 KiB or more in one pass");
    // Another session's request on other memory; a decryption of the
    // second burst request's output, on its session; a request reading
    // the third's output; the first's message's next part.
    p.submit(3, cipher(s3, F_ENCRYPT | F_IV, src, x, 4096, &iv).encode());
    p.submit(4, cipher(s[1], F_IV, b, w, lens[1], &iv).encode());
    p.submit(5, cipher(s4, F_ENCRYPT | F_IV, c, y, 4096, &iv).encode());
    p.submit(
        6,
        cipher(s[0], F_ENCRYPT, src + MIB as u64, a + MIB as u64, 4096, &[]).encode(),
    );
    p.run(&mut q, &mut mem);
    for t in 0..7 {
        assert_eq!(p.status(t), 0, "request {t}");
    }
    let (first, second, third) = (p.pass_of(0), p.pass_of(1), p.pass_of(2));
    assert!(second < third && third < first);
    assert_eq!(p.pass_of(3), 2, "another session's request waited");
    for (t, after, before) in [(4, second, third), (5, third, first)] {
        assert!(p.waited[&t] > 1, "request {t} did not wait");
        assert!(
            after < p.pass_of(t) && p.pass_of(t) <= before,
            "request {t} ran in pass {}, not between {after} and {before}",
            p.pass_of(t)
        );
    }
    // (The first goes faster once it is alone: it waits less.)
    assert!(p.waited[&6] > 0 && p.pass_of(6) > first);
    let encrypted = |k: usize, n: usize| {
        openssl_crypt(
            Cipher::aes_128_cbc(),
            &keys[k],
            Some(&iv),
            &plain[..n],
            true,
        )
    };
    assert!(
        mem.get(a, MIB + 4096) == encrypted(0, MIB + 4096),
        "the message over two requests"
    );
    assert!(mem.get(w, lens[1]) == plain[..lens[1]], "the decryption");
    assert_eq!(
        mem.get(x, 4096),
        openssl_crypt(Cipher::aes_128_ctr(), &k3, Some(&iv), &plain[..4096], true)
    );
    assert_eq!(
        mem.get(y, 4096),
        openssl_crypt(
            Cipher::aes_128_ctr(),
            &k3,
            Some(&iv),
            &encrypted(2, 4096),
            true
        )
    );
}

/// Random messages of every key size over 24 sessions (more than a round's
/// 16 lanes, so rounds share out less of each), parts from a block to
/// 512 KiB, in place or not, sent a random number per pass, with memory
/// the device can hold or not: every message is OpenSSL's.
#[test]
fn random_bursts_over_rounds_match_openssl() {
    let Some(e) = mb_engine("random_bursts_over_rounds_match_openssl") else {
        return;
    };
    let mut rng: u64 = 0x2545f4914f6cdd1d;
    let mut next = move |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let mut held = 0;
    for _ in 0..3 {
        let lens: Vec<Vec<usize>> = (0..24)
            .map(|_| {
                (0..1 + next(5))
                    .map(|_| {
                        16 * match next(3) {
                            0 => 1 + next(256),
                            1 => 4096 - 64 + next(128),
                            _ => 1 + next(32768),
                        } as usize
                    })
                    .collect()
            })
            .collect();
        let room: usize = lens.iter().flatten().map(|n| 2 * n + 128).sum();
        let mut mem = mem(room + (1 << 20), true);
        let mut q = SecQueue::with_engine(TYPE_CIPHER, Some(e));
        let mut at = BASE + 0x1_0000;
        let mut msgs = Vec::new();
        for (k, lens) in lens.iter().enumerate() {
            let key: Vec<u8> = (0..[16, 24, 32][k % 3]).map(|_| next(256) as u8).collect();
            let s = session(&mut q, &mut mem, cbc(&key), &key);
            let plain = data(lens.iter().sum(), 7 * k + 1);
            let mut m = Message::place(&mut mem, &mut at, (s, key, [0; 16]), plain, lens, |_| {
                (next(2) == 0, 16 * next(8))
            });
            m.iv.iter_mut().for_each(|b| *b = next(256) as u8);
            msgs.push(m);
        }
        // Ring order: each message's parts in order, messages interleaved.
        let mut order = Vec::new();
        let mut sent = vec![0usize; msgs.len()];
        while order.len() < msgs.iter().map(|m| m.placed.len()).sum() {
            let k = next(msgs.len() as u64) as usize;
            if sent[k] < msgs[k].placed.len() {
                order.push((k, sent[k]));
                sent[k] += 1;
            }
        }
        let mut p = Passes::default();
        let mut order = order.into_iter().peekable();
        while order.peek().is_some() || !p.waiting.is_empty() || q.in_flight() > 0 {
            for _ in 0..next(24) {
                let Some((k, j)) = order.next() else {
                    break;
                };
                p.submit((k * 10 + j) as u64, msgs[k].part(j));
            }
            common::set_direct(&mut mem, next(10) != 0);
            p.pass(&mut q, &mut mem);
            assert!(p.passes < 100_000);
        }
        held += p.held;
        assert!(p.done.values().all(|(_, d)| d.status == 0));
        for (k, m) in msgs.iter().enumerate() {
            assert!(
                m.output(&mem) == m.openssl(&[]),
                "message {k} (AES-{}, parts {:?}) differs from OpenSSL's",
                m.key.len() * 8,
                m.placed.iter().map(|x| x.2).collect::<Vec<_>>()
            );
        }
    }
    assert!(held > 100, "{held} requests held: too few bursts to test");
}
