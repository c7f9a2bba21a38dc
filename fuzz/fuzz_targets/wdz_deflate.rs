//! Programs of deflate calls through the drop-in zlib (libwdz.so: streams
//! gathered whole, left in pieces at a large flush, handed to zlib-rs or
//! the system zlib by a small flush or a level change, output waiting in
//! the shim for room), each stream then decoded by the system zlib: never
//! a crash; every call answers as zlib may (`Z_OK` or `Z_BUF_ERROR`, and
//! `Z_STREAM_END` at the end); a sync or full flush's output ends in
//! `00 00 FF FF`; the stream decodes to exactly the input given, with its
//! dictionary, and `strm->adler` is the check value of that input.
//!
//! The libraries: see `wd_fuzz::zlib`. Input: a selector byte (framing
//! and level), a dictionary length, then calls: a byte (flush, input
//! size class, or a level change), the input size, the output room.
#![no_main]
use std::ffi::{c_char, c_int, c_ulong};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wd_fuzz::zlib::{
    entry, libraries, ZStream, STREAM_SIZE, VERSION, Z_BUF_ERROR, Z_NEED_DICT, Z_OK, Z_STREAM_END,
};
use wd_fuzz::Input;
use wd_sys::dl::Library;

type DeflateInit2 = unsafe extern "C" fn(
    *mut ZStream,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_char,
    c_int,
) -> c_int;
type InflateInit2 = unsafe extern "C" fn(*mut ZStream, c_int, *const c_char, c_int) -> c_int;
type Call = unsafe extern "C" fn(*mut ZStream, c_int) -> c_int;
type End = unsafe extern "C" fn(*mut ZStream) -> c_int;
type SetDict = unsafe extern "C" fn(*mut ZStream, *const u8, u32) -> c_int;
type Params = unsafe extern "C" fn(*mut ZStream, c_int, c_int) -> c_int;
type Check = unsafe extern "C" fn(c_ulong, *const u8, u32) -> c_ulong;

/// The shim's deflate side.
struct Deflater {
    init: DeflateInit2,
    deflate: Call,
    end: End,
    set_dict: SetDict,
    params: Params,
}

/// The system zlib's inflate side and check values.
struct Inflater {
    init: InflateInit2,
    inflate: Call,
    end: End,
    set_dict: SetDict,
    adler32: Check,
    crc32: Check,
}

fn both() -> &'static (Deflater, Inflater) {
    static BOTH: OnceLock<(Deflater, Inflater)> = OnceLock::new();
    BOTH.get_or_init(|| {
        let (shim, system): &(Library, Library) = libraries();
        // SAFETY: each type above is zlib.h's declaration of the entry
        // point; the libraries stay loaded.
        unsafe {
            (
                Deflater {
                    init: entry(shim, "deflateInit2_"),
                    deflate: entry(shim, "deflate"),
                    end: entry(shim, "deflateEnd"),
                    set_dict: entry(shim, "deflateSetDictionary"),
                    params: entry(shim, "deflateParams"),
                },
                Inflater {
                    init: entry(system, "inflateInit2_"),
                    inflate: entry(system, "inflate"),
                    end: entry(system, "inflateEnd"),
                    set_dict: entry(system, "inflateSetDictionary"),
                    adler32: entry(system, "adler32"),
                    crc32: entry(system, "crc32"),
                },
            )
        }
    })
}

/// The text the streams compress (its start is the dictionary's source).
fn text() -> &'static [u8] {
    static TEXT: OnceLock<Vec<u8>> = OnceLock::new();
    TEXT.get_or_init(|| wd_testutil::text(TEXT_LEN, 11))
}

const TEXT_LEN: usize = 1 << 20;
const DICT_AT: usize = TEXT_LEN - (40 << 10);
const Z_NO_FLUSH: c_int = 0;
const Z_PARTIAL_FLUSH: c_int = 1;
const Z_SYNC_FLUSH: c_int = 2;
const Z_FULL_FLUSH: c_int = 3;
const Z_FINISH: c_int = 4;
const Z_BLOCK: c_int = 5;
/// Calls of one kind before the harness gives up (each must make
/// progress; output may come a byte at a time).
const MAX_CALLS: usize = 1 << 22;

/// The stream under test and everything it wrote.
struct Run<'a> {
    z: &'a Deflater,
    s: ZStream,
    out: Vec<u8>,
}

impl Run<'_> {
    /// One call of `f` (deflate or a level change) with `room` bytes of
    /// output after what was written.
    fn call(&mut self, room: usize, f: impl FnOnce(&Deflater, &mut ZStream) -> c_int) -> c_int {
        let at = self.out.len();
        self.out.resize(at + room, 0);
        self.s.next_out = self.out[at..].as_mut_ptr();
        self.s.avail_out = room as u32;
        let ret = f(self.z, &mut self.s);
        self.out.truncate(at + room - self.s.avail_out as usize);
        ret
    }

    /// deflate(`flush`) on `input` in as many calls as zlib's contract
    /// asks: a flush again while it fills the room, input until taken.
    fn deflate(&mut self, input: &[u8], flush: c_int, room: usize) {
        self.s.next_in = input.as_ptr();
        self.s.avail_in = input.len() as u32;
        for _ in 0..MAX_CALLS {
            let (left, wrote) = (self.s.avail_in, self.out.len());
            // SAFETY: next_in/avail_in and (in call) next_out/avail_out
            // describe live buffers; the stream was initialised.
            let ret = self.call(room, |z, s| unsafe { (z.deflate)(s, flush) });
            assert!(ret == Z_OK || ret == Z_BUF_ERROR, "deflate({flush}): {ret}");
            if self.s.avail_out != 0 && self.s.avail_in == 0 {
                return;
            }
            assert!(
                self.s.avail_in != left || self.out.len() != wrote,
                "deflate({flush}) makes no progress, {left} bytes of input left"
            );
        }
        panic!("deflate({flush}) does not finish");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let sel = input.take(1) as usize;
    let window: c_int = [15, -15, 31][sel % 3];
    let level: c_int = [1, 1, 6, 9, -1, 2, 1, 4][(sel >> 2) & 7];
    let dict_len = match window {
        31 => 0, // (zlib takes no dictionary for gzip)
        _ => input.take(1) as usize * 129,
    };
    let (z, sys) = both();
    let text = text();
    let dict = &text[DICT_AT..DICT_AT + dict_len];
    let mut run = Run {
        z,
        s: ZStream::new(),
        out: Vec::new(),
    };
    // SAFETY: a zeroed z_stream; VERSION NUL-terminated, the size the
    // structure's.
    let ret = unsafe {
        (z.init)(
            &mut run.s,
            level,
            8,
            window,
            8,
            0,
            VERSION.as_ptr().cast(),
            STREAM_SIZE,
        )
    };
    assert_eq!(ret, Z_OK, "deflateInit2_");
    if dict_len > 0 {
        // SAFETY: a live buffer of dict_len bytes.
        let ret = unsafe { (z.set_dict)(&mut run.s, dict.as_ptr(), dict_len as u32) };
        assert_eq!(ret, Z_OK, "deflateSetDictionary");
    }
    let mut fed = 0;
    for _ in 0..32 {
        if input.done() {
            break;
        }
        let op = input.take(1) as usize;
        let len = match (op >> 3) & 3 {
            0 => input.take(1) as usize * 17,
            1 => input.take(2) as usize,
            2 => 65536 + input.take(2) as usize * 2,
            _ => 0,
        }
        .min(DICT_AT - fed);
        let room = 1 + input.take(1) as usize * 257;
        if op & 0x80 != 0 {
            // A level change: zlib may need room to compress what it has
            // at the old level first.
            let to = (op >> 5 & 3) as c_int * 3;
            run.s.next_in = text[fed..].as_ptr();
            run.s.avail_in = 0;
            let mut ret = Z_BUF_ERROR;
            for _ in 0..MAX_CALLS {
                // SAFETY: as in Run::deflate.
                ret = run.call(room, |z, s| unsafe { (z.params)(s, to, 0) });
                if ret != Z_BUF_ERROR {
                    break;
                }
            }
            assert_eq!(ret, Z_OK, "deflateParams({to})");
            continue;
        }
        let flush = [
            Z_NO_FLUSH,
            Z_NO_FLUSH,
            Z_NO_FLUSH,
            Z_SYNC_FLUSH,
            Z_FULL_FLUSH,
            Z_BLOCK,
            Z_PARTIAL_FLUSH,
            Z_NO_FLUSH,
        ][op & 7];
        // (zlib's manual: more than six bytes of room for a flush, or an
        // output that fills it asks for the flush again, which writes
        // another marker, for ever.)
        let room = if flush == Z_NO_FLUSH {
            room
        } else {
            room.max(7)
        };
        run.deflate(&text[fed..fed + len], flush, room);
        fed += len;
        // (zlib counts the dictionary's bytes that fill its window.)
        assert_eq!(
            run.s.total_in as usize,
            dict_len.min(1 << 15) + fed,
            "total_in"
        );
        if flush == Z_SYNC_FLUSH || flush == Z_FULL_FLUSH {
            assert!(
                run.out.ends_with(&[0, 0, 0xff, 0xff]),
                "a flush ({flush}) that does not end at a byte boundary"
            );
        }
    }
    let room = 1 + input.take(1) as usize * 257;
    run.s.next_in = text[fed..].as_ptr();
    run.s.avail_in = 0;
    let mut ended = false;
    for _ in 0..MAX_CALLS {
        // SAFETY: as in Run::deflate.
        let ret = run.call(room, |z, s| unsafe { (z.deflate)(s, Z_FINISH) });
        if ret == Z_STREAM_END {
            ended = true;
            break;
        }
        assert!(
            ret == Z_OK || ret == Z_BUF_ERROR,
            "deflate(Z_FINISH): {ret}"
        );
    }
    assert!(ended, "deflate(Z_FINISH) does not end");
    let adler = run.s.adler;
    // SAFETY: initialised above, ended once.
    assert_eq!(unsafe { (z.end)(&mut run.s) }, Z_OK, "deflateEnd");

    // The system zlib decodes it.
    let data = &text[..fed];
    let mut s = ZStream::new();
    // SAFETY: a zeroed z_stream, as above.
    let ret = unsafe { (sys.init)(&mut s, window, VERSION.as_ptr().cast(), STREAM_SIZE) };
    assert_eq!(ret, Z_OK);
    let mut back = vec![0u8; fed + 1];
    s.next_in = run.out.as_ptr();
    s.avail_in = run.out.len() as u32;
    s.next_out = back.as_mut_ptr();
    s.avail_out = back.len() as u32;
    // SAFETY: live buffers as described; the dictionary's too.
    let ret = unsafe {
        if dict_len > 0 && window < 0 {
            assert_eq!((sys.set_dict)(&mut s, dict.as_ptr(), dict_len as u32), Z_OK);
        }
        let mut ret = (sys.inflate)(&mut s, Z_FINISH);
        if dict_len > 0 && window > 0 {
            assert_eq!(
                ret, Z_NEED_DICT,
                "a zlib stream given a dictionary names it"
            );
            assert_eq!((sys.set_dict)(&mut s, dict.as_ptr(), dict_len as u32), Z_OK);
            ret = (sys.inflate)(&mut s, Z_FINISH);
        }
        ret
    };
    let got = s.total_out as usize;
    // SAFETY: initialised above, ended once.
    unsafe { (sys.end)(&mut s) };
    assert_eq!(ret, Z_STREAM_END, "the system zlib does not end the stream");
    assert!(got == fed && back[..fed] == *data, "decoded data differs");
    if window > 0 {
        let f = if window == 31 { sys.crc32 } else { sys.adler32 };
        // SAFETY: a live buffer of `fed` bytes; both only read it.
        let check = unsafe { f(f(0, std::ptr::null(), 0), data.as_ptr(), fed as u32) };
        assert_eq!(adler, check, "strm->adler at the end");
    }
});
