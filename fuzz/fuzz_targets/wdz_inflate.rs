//! Hostile and valid compressed data through the drop-in zlib's inflate
//! (libwdz.so: its whole-stream path, the small streams on a kept zlib
//! state, zlib-rs for pieces, the lazy zlib state, output waiting in the
//! shim) against the system zlib, with the same pieces and rooms: never a
//! crash, every stream the system zlib ends the shim ends too, with the
//! same data, input taken and check value. The shim may end a stream the
//! system zlib refuses only for the encodings libdeflate's decoder
//! accepts and zlib's does not (docs/compression.md lists them), and then
//! in a checked framing its data must match the stream's check value.
//! Raw streams also go through `inflateBack` (zlib-rs's inflate in the
//! shim), input handed out in the same pieces: the same return, output,
//! input left over and message as the system zlib's.
//!
//! The libraries: see `wd_fuzz::zlib`. Input: a selector byte
//! (windowBits, whether the rest is compressed here first, at which
//! level), room and piece sizes, a byte to flip and bytes to cut, then
//! the data.
#![no_main]
use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wd_fuzz::zlib::{
    entry, libraries, ZStream, STREAM_SIZE, VERSION, Z_BUF_ERROR, Z_DATA_ERROR, Z_OK, Z_STREAM_END,
};
use wd_sys::dl::Library;
use wd_zip_codec::Engine;
use wd_zip_msg::Algorithm;

type InflateInit2 = unsafe extern "C" fn(*mut ZStream, c_int, *const c_char, c_int) -> c_int;
type Inflate = unsafe extern "C" fn(*mut ZStream, c_int) -> c_int;
type InflateEnd = unsafe extern "C" fn(*mut ZStream) -> c_int;
type Check = unsafe extern "C" fn(c_ulong, *const u8, u32) -> c_ulong;
type InFunc = unsafe extern "C" fn(*mut c_void, *mut *const u8) -> u32;
type OutFunc = unsafe extern "C" fn(*mut c_void, *mut u8, u32) -> c_int;
type BackInit = unsafe extern "C" fn(*mut ZStream, c_int, *mut u8, *const c_char, c_int) -> c_int;
type Back = unsafe extern "C" fn(*mut ZStream, InFunc, *mut c_void, OutFunc, *mut c_void) -> c_int;

/// One zlib's entry points.
struct Zlib {
    init: InflateInit2,
    inflate: Inflate,
    end: InflateEnd,
    adler32: Check,
    crc32: Check,
    back_init: BackInit,
    back: Back,
    back_end: InflateEnd,
}

fn zlib(lib: &Library) -> Zlib {
    // SAFETY: each type above is zlib.h's declaration of the entry point;
    // the libraries stay loaded.
    unsafe {
        Zlib {
            init: entry(lib, "inflateInit2_"),
            inflate: entry(lib, "inflate"),
            end: entry(lib, "inflateEnd"),
            adler32: entry(lib, "adler32"),
            crc32: entry(lib, "crc32"),
            back_init: entry(lib, "inflateBackInit_"),
            back: entry(lib, "inflateBack"),
            back_end: entry(lib, "inflateBackEnd"),
        }
    }
}

/// The shim's entry points and the system zlib's.
fn both() -> &'static (Zlib, Zlib) {
    static BOTH: OnceLock<(Zlib, Zlib)> = OnceLock::new();
    BOTH.get_or_init(|| {
        let (shim, system) = libraries();
        (zlib(shim), zlib(system))
    })
}

const MAX_OUT: usize = 1 << 20;

/// What decoding with given pieces and rooms came to.
#[derive(Debug)]
struct Outcome {
    ended: bool,
    out: Vec<u8>,
    total_in: c_ulong,
    adler: Option<c_ulong>,
    /// zlib's `msg` when it refused the stream.
    refusal: Option<String>,
}

/// zlib's refusals of encodings libdeflate decodes: length symbols 286
/// and 287 and distance symbols 30 and 31 (which zlib's fixed code and
/// an incomplete code's unused half also lead to), more than 286 length
/// or 30 distance codes, a code-length code of one codeword.
const LENIENT: [&str; 4] = [
    "invalid literal/length code",
    "invalid distance code",
    "too many length or distance symbols",
    "invalid code lengths set",
];

/// The check value `data` gives in the framing of `input` decoded with
/// `window`: zlib's Adler-32 or gzip's CRC-32 (window 47 takes either).
fn check(z: &Zlib, window: c_int, input: &[u8], data: &[u8]) -> c_ulong {
    let gzip = window == 31 || (window == 47 && input.starts_with(&[0x1f, 0x8b]));
    let f = if gzip { z.crc32 } else { z.adler32 };
    let len = u32::try_from(data.len()).expect("MAX_OUT bounds the data");
    // SAFETY: `data` is a live buffer of `len` bytes; both functions only
    // read it. Their initial value is that of a NULL buffer: 1 and 0.
    unsafe { f(f(0, std::ptr::null(), 0), data.as_ptr(), len) }
}

fn decode(z: &Zlib, window: c_int, input: &[u8], room: usize, piece: usize) -> Outcome {
    let mut s = ZStream::new();
    // SAFETY: `s` is a zeroed z_stream; VERSION is NUL-terminated and the
    // size is the structure's.
    let ret = unsafe { (z.init)(&mut s, window, VERSION.as_ptr().cast(), STREAM_SIZE) };
    assert_eq!(ret, Z_OK, "inflateInit2_({window})");
    let mut out = Vec::new();
    let mut buf = vec![0u8; room];
    let mut at = 0;
    let mut ended = false;
    let mut ret = Z_OK;
    for _ in 0..100_000 {
        let n = (input.len() - at).min(piece);
        s.next_in = input[at..].as_ptr();
        s.avail_in = n as u32;
        s.next_out = buf.as_mut_ptr();
        s.avail_out = room as u32;
        // SAFETY: next_in/avail_in and next_out/avail_out describe live
        // buffers of those lengths; `s` was initialised above.
        ret = unsafe { (z.inflate)(&mut s, 0) };
        let took = n - s.avail_in as usize;
        let made = room - s.avail_out as usize;
        at += took;
        out.extend_from_slice(&buf[..made]);
        if ret == Z_STREAM_END {
            ended = true;
            break;
        }
        if (ret != Z_OK && ret != Z_BUF_ERROR) || out.len() > MAX_OUT {
            break;
        }
        if took == 0 && made == 0 && at == input.len() {
            break; // All given, no progress: it will not end.
        }
    }
    let o = Outcome {
        ended,
        out,
        total_in: s.total_in,
        // A raw stream's `adler` is the caller's, not a check value.
        adler: (ended && window >= 0).then_some(s.adler),
        refusal: (ret != Z_OK && ret != Z_BUF_ERROR && ret != Z_STREAM_END && !s.msg.is_null())
            .then(|| {
                // SAFETY: zlib's msg, when set, is a NUL-terminated static
                // string.
                unsafe { std::ffi::CStr::from_ptr(s.msg) }
                    .to_string_lossy()
                    .into_owned()
            }),
    };
    // SAFETY: initialised above, ended once.
    unsafe { (z.end)(&mut s) };
    o
}

/// inflateBack's input and output, as its callbacks see them.
struct BackIo<'a> {
    input: &'a [u8],
    at: usize,
    piece: usize,
    out: Vec<u8>,
}

unsafe extern "C" fn back_in(desc: *mut c_void, buf: *mut *const u8) -> u32 {
    // SAFETY: `desc` is the BackIo that back_decode passes, alive and not
    // otherwise borrowed during the call; `buf` is inflateBack's pointer.
    let io = unsafe { &mut *desc.cast::<BackIo>() };
    let n = (io.input.len() - io.at).min(io.piece);
    // SAFETY: as above.
    unsafe { *buf = io.input[io.at..].as_ptr() };
    io.at += n;
    n as u32
}

unsafe extern "C" fn back_out(desc: *mut c_void, buf: *mut u8, len: u32) -> c_int {
    // SAFETY: as in back_in.
    let io = unsafe { &mut *desc.cast::<BackIo>() };
    if io.out.len() > MAX_OUT {
        return 1; // enough: the call stops with Z_BUF_ERROR
    }
    // SAFETY: inflateBack hands `len` bytes of its window at `buf`.
    io.out
        .extend_from_slice(unsafe { std::slice::from_raw_parts(buf, len as usize) });
    0
}

/// A raw stream through inflateBack: its return, output, where the input
/// left over begins (None: `next_in` NULL) and how much, and message.
fn back_decode(
    z: &Zlib,
    input: &[u8],
    piece: usize,
) -> (c_int, Vec<u8>, Option<usize>, u32, Option<String>) {
    let mut window = vec![0u8; 1 << 15];
    let mut s = ZStream::new();
    // SAFETY: a zeroed z_stream and a window of 1 << 15 bytes, which
    // outlives the stream (ended below).
    let ret = unsafe {
        (z.back_init)(
            &mut s,
            15,
            window.as_mut_ptr(),
            VERSION.as_ptr().cast(),
            STREAM_SIZE,
        )
    };
    assert_eq!(ret, Z_OK, "inflateBackInit_");
    let mut io = BackIo {
        input,
        at: 0,
        piece: piece.max(1),
        out: Vec::new(),
    };
    let desc: *mut c_void = (&raw mut io).cast();
    // SAFETY: initialised above; the callbacks get `desc`, the BackIo
    // above, which lives through the call.
    let ret = unsafe { (z.back)(&mut s, back_in, desc, back_out, desc) };
    let left_at =
        (!s.next_in.is_null()).then(|| (s.next_in as usize).wrapping_sub(input.as_ptr() as usize));
    let msg = (!s.msg.is_null()).then(|| {
        // SAFETY: zlib's msg, when set, is a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(s.msg) }
            .to_string_lossy()
            .into_owned()
    });
    // SAFETY: initialised above, ended once.
    unsafe { (z.back_end)(&mut s) };
    (ret, io.out, left_at, s.avail_in, msg)
}

/// zlib's message for a distance past the data so far.
const FAR: &str = "invalid distance too far back";

/// The shim's message for damage zlib-rs's fast loop finds: zlib-rs loses
/// which it was (docs/compression.md).
const FAST_DAMAGE: &str =
    "invalid literal/length code, invalid distance code or invalid distance too far back";

/// Whether the shim's message is zlib's: for FAST_DAMAGE, zlib's is one
/// of the three.
fn same_msg(shim: Option<&str>, zlib: Option<&str>) -> bool {
    const ZLIB: [&str; 3] = ["invalid literal/length code", "invalid distance code", FAR];
    match (shim, zlib) {
        (Some(FAST_DAMAGE), Some(z)) => ZLIB.contains(&z),
        (a, b) => a == b,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, body)) = data.split_first_chunk::<5>() else {
        return;
    };
    let [sel, room, piece, flip, cut] = *head;
    let window = [15, -15, 31, 47, 0, 12][(sel & 7) as usize % 6];
    let (shim, system) = both();
    let mut input = body.to_vec();
    if sel & 8 != 0 && !body.is_empty() {
        // A valid stream of the framing (47 and 0: zlib's or gzip's),
        // made by the project's engines, then damaged as the other bytes
        // say.
        let alg = match window {
            -15 => Algorithm::Deflate,
            31 => Algorithm::Gzip,
            47 if sel & 0x80 != 0 => Algorithm::Gzip,
            _ => Algorithm::Zlib,
        };
        let level = 1 + (sel >> 4) as i8 % 9;
        input = Vec::new();
        Engine::new()
            .compress_vec(alg, level, body, &mut input)
            .expect("the engines compress any input");
        if flip != 0 {
            let at = flip as usize * 7919 % input.len();
            input[at] ^= 0x5a;
        }
        let cut = (cut as usize).min(input.len());
        input.truncate(input.len() - cut);
    }
    let room = 1 + room as usize * 67;
    let piece = if piece == 0 {
        usize::MAX
    } else {
        piece as usize * 13
    };
    if window == -15 {
        let (ret, out, left_at, left, msg) = back_decode(shim, &input, piece);
        let (zret, zout, zleft_at, zleft, zmsg) = back_decode(system, &input, piece);
        let far = matches!(msg.as_deref(), Some(FAR | FAST_DAMAGE));
        if far && (!same_msg(msg.as_deref(), zmsg.as_deref()) || out != zout) {
            // The system zlib's inflateBack lets some of these through (its
            // fast loop counts the output as history twice, a bug zlib
            // fixed later) and goes on with window bytes nobody wrote; the
            // shim refuses them as zlib's inflate does, having written what
            // came before (zlib may refuse a later one). Found in zlib-rs's
            // fast loop, the shim's message is FAST_DAMAGE.
            assert_eq!(ret, Z_DATA_ERROR);
            assert!(
                zout.starts_with(&out),
                "inflateBack: output before the distance differs"
            );
            return;
        }
        assert_eq!(ret, zret, "inflateBack: return ({msg:?}, zlib {zmsg:?})");
        assert!(out == zout, "inflateBack: output differs");
        assert!(
            same_msg(msg.as_deref(), zmsg.as_deref()),
            "inflateBack: message {msg:?}, zlib {zmsg:?}"
        );
        if zret == Z_BUF_ERROR && zleft_at.is_some() {
            // `out` refused: zlib promises a next_in that is not NULL;
            // how much input was pulled before is each decoder's own.
            assert!(
                left_at.is_some(),
                "inflateBack: next_in NULL after out refused"
            );
        } else {
            assert_eq!(
                (left_at, left),
                (zleft_at, zleft),
                "inflateBack: input left"
            );
        }
    }
    let a = decode(shim, window, &input, room, piece);
    let b = decode(system, window, &input, room, piece);
    if b.ended {
        assert!(
            a.ended,
            "window {window}: the shim refuses a stream zlib ends: {a:?}"
        );
        assert_eq!(
            (&a.out, a.total_in, a.adler),
            (&b.out, b.total_in, b.adler),
            "window {window}: a stream that ends differs"
        );
    } else if a.ended {
        let why = b
            .refusal
            .as_deref()
            .unwrap_or("no refusal: it wants more input");
        assert!(
            LENIENT.contains(&why),
            "window {window}: the shim ends a stream zlib refuses with {why:?}"
        );
        if let Some(adler) = a.adler {
            assert_eq!(
                check(system, window, &input, &a.out),
                adler,
                "window {window}: ended on an encoding zlib refuses ({why}), data not the check value's"
            );
        }
    }
});
