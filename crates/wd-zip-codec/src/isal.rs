//! ISA-L's igzip (`libisal.so.2`), loaded at run time when the machine
//! has it and `WD_ZIP_ISAL=1` asks for it: one-shot deflate, zlib and
//! gzip compression at level 1, where it is several times faster than
//! libdeflate's level 1 (see `wd bench zip`) for output within a few
//! percent of zlib's. Everything else stays with libdeflate, which also
//! takes over whenever igzip's output does not fit the room given.
//!
//! Opt-in because igzip's output is valid but not reproducible: with
//! ISA-L 2.30, where its `struct isal_zstream` lies in memory changes the
//! level 1 matcher's choices for some inputs (for one 105-byte gzip
//! member, 42 of 3000 structure addresses turned a match of 8 into a
//! literal and a match of 7; the histogram, and so the stream, follow).
//! It is the structure's own address, not the input's nor the two's
//! distance: with the input moved and the structure kept, 0 of 2000 4 KiB
//! blocks differed; with the structure moved by 64 KiB, 8 of 2000, and by
//! whole multiples of 4 GiB still 1 of 2000 (memory zeroed each time,
//! valgrind sees no uninitialised read). So no placement makes it
//! reproducible across processes. The same block therefore compresses to different bytes in the device
//! and in a client's CPU engine, or in two runs; both decode to the input.
//! libdeflate's output depends on the input and level only, which
//! deduplication and content hashes downstream rely on.
//!
//! The stream structure is igzip's `struct isal_zstream`; this module
//! writes only the fields below, at offsets that `tests/isal_abi.rs`
//! checks against the installed header. A library that does not
//! round-trip a known text at load is not used.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::OnceLock;

use wd_zip_msg::Algorithm;

use crate::mem::{Input, Output};

/// Offsets and sizes of `struct isal_zstream` (isa-l 2.x, x86-64).
pub mod abi {
    /// `uint8_t *next_in`.
    pub const NEXT_IN: usize = 0;
    /// `uint32_t avail_in`.
    pub const AVAIL_IN: usize = 8;
    /// `uint8_t *next_out`.
    pub const NEXT_OUT: usize = 16;
    /// `uint32_t avail_out`.
    pub const AVAIL_OUT: usize = 24;
    /// `uint32_t total_out`.
    pub const TOTAL_OUT: usize = 28;
    /// `uint32_t level`.
    pub const LEVEL: usize = 40;
    /// `uint32_t level_buf_size`.
    pub const LEVEL_BUF_SIZE: usize = 44;
    /// `uint8_t *level_buf`.
    pub const LEVEL_BUF: usize = 48;
    /// `uint16_t end_of_stream`.
    pub const END_OF_STREAM: usize = 56;
    /// `uint16_t flush` (NO_FLUSH = 0).
    pub const FLUSH: usize = 58;
    /// `uint16_t gzip_flag`.
    pub const GZIP_FLAG: usize = 60;
    /// `sizeof(struct isal_zstream)`.
    pub const SIZE: usize = 82_384;
    /// `ISAL_DEF_LVL1_DEFAULT`: level 1's work buffer.
    pub const LEVEL1_BUF: usize = 282_624;
    /// `gzip_flag` values: `IGZIP_DEFLATE`, `IGZIP_GZIP`, `IGZIP_ZLIB`.
    pub const DEFLATE: u16 = 0;
    /// See [`DEFLATE`].
    pub const GZIP: u16 = 1;
    /// See [`DEFLATE`].
    pub const ZLIB: u16 = 3;
    /// `COMP_OK`, `STATELESS_OVERFLOW`.
    pub const COMP_OK: i32 = 0;
    /// See [`COMP_OK`].
    pub const STATELESS_OVERFLOW: i32 = -1;
}

type Init = unsafe extern "C" fn(*mut c_void);
type Stateless = unsafe extern "C" fn(*mut c_void) -> i32;

/// The loaded library's two entry points.
struct Lib {
    init: Init,
    stateless: Stateless,
    _lib: wd_sys::dl::Library,
}

fn lib() -> Option<&'static Lib> {
    static LIB: OnceLock<Option<Lib>> = OnceLock::new();
    LIB.get_or_init(|| {
        // Opt-in: its output is not reproducible (see the module's doc).
        if std::env::var("WD_ZIP_ISAL").map_or(true, |v| v != "1") {
            return None;
        }
        let lib = wd_sys::dl::load_system("libisal.so.2").ok()?;
        let i = lib.symbol("isal_deflate_stateless_init")?;
        let s = lib.symbol("isal_deflate_stateless")?;
        // SAFETY: igzip_lib.h declares both as taking a `struct
        // isal_zstream *` (void (*)(...) and int (*)(...)); the library
        // stays loaded as long as `_lib`, which lives in a static.
        let (init, stateless) = unsafe {
            (
                std::mem::transmute::<*mut c_void, Init>(i.as_ptr()),
                std::mem::transmute::<*mut c_void, Stateless>(s.as_ptr()),
            )
        };
        let l = Lib {
            init,
            stateless,
            _lib: lib,
        };
        known_answer(&l).then_some(l)
    })
    .as_ref()
}

/// Whether igzip serves level 1 here: `WD_ZIP_ISAL=1`, the library
/// present, and its known answer right.
pub fn available() -> bool {
    lib().is_some()
}

/// A text compressed at load must come back whole through libdeflate,
/// in every framing, or the library (or our layout of its structure) is
/// not the one this module was written for.
fn known_answer(l: &Lib) -> bool {
    let text: Vec<u8> = b"queue domain IOVA engine session namespace PRP gather "
        .iter()
        .copied()
        .cycle()
        .take(100_000)
        .collect();
    let mut c = Compressor { state: None };
    let Some(mut d) = crate::libdeflate::Decompressor::new() else {
        return false;
    };
    [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Gzip]
        .into_iter()
        .all(|alg| {
            let mut z = vec![0u8; 4096];
            let Some(n) = c.compress_with(l, alg, &text[..], &mut z[..]) else {
                return false;
            };
            let mut back = vec![0u8; text.len()];
            matches!(d.decompress(alg, &z[..n], &mut back[..]), Ok((used, m)) if used == n && m == text.len())
                && back == text
        })
}

/// Level 1 compression state: the stream structure and its work buffer,
/// made on first use (about 360 KiB).
#[derive(Default)]
pub(crate) struct Compressor {
    state: Option<Buffers>,
}

/// The stream structure and the level's work buffer, 8-aligned.
type Buffers = (Box<[u64]>, Box<[u64]>);

impl Compressor {
    /// Compress `input` into `out` in `alg`'s framing at level 1; `None`
    /// when igzip is not here, the framing is not deflate's, or the output
    /// does not fit (the caller then uses libdeflate).
    pub(crate) fn compress(
        &mut self,
        alg: Algorithm,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Option<usize> {
        self.compress_with(lib()?, alg, input, out)
    }

    fn compress_with(
        &mut self,
        l: &Lib,
        alg: Algorithm,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Option<usize> {
        let flag = match alg {
            Algorithm::Deflate => abi::DEFLATE,
            Algorithm::Zlib => abi::ZLIB,
            Algorithm::Gzip => abi::GZIP,
            _ => return None,
        };
        let avail_in = u32::try_from(input.len()).ok()?;
        let avail_out = u32::try_from(out.len()).unwrap_or(u32::MAX);
        let (s, work) = self.state.get_or_insert_with(|| {
            (
                vec![0u64; abi::SIZE.div_ceil(8)].into_boxed_slice(),
                vec![0u64; abi::LEVEL1_BUF.div_ceil(8)].into_boxed_slice(),
            )
        });
        let p = s.as_mut_ptr().cast::<u8>();
        // SAFETY: `s` is an 8-aligned buffer of at least the structure's
        // size, so init may write all of it; then each field is written
        // at its offset (checked against the header) with its own type;
        // the input and output ranges are valid for the call by the
        // Input/Output contracts, and igzip reads at most avail_in bytes
        // and writes at most avail_out (the work buffer is its own).
        let (r, total) = unsafe {
            (l.init)(p.cast());
            p.add(abi::NEXT_IN).cast::<*const u8>().write(input.ptr());
            p.add(abi::AVAIL_IN).cast::<u32>().write(avail_in);
            p.add(abi::NEXT_OUT).cast::<*mut u8>().write(out.ptr());
            p.add(abi::AVAIL_OUT).cast::<u32>().write(avail_out);
            p.add(abi::LEVEL).cast::<u32>().write(1);
            p.add(abi::LEVEL_BUF_SIZE)
                .cast::<u32>()
                .write(abi::LEVEL1_BUF as u32);
            p.add(abi::LEVEL_BUF)
                .cast::<*mut u8>()
                .write(work.as_mut_ptr().cast());
            p.add(abi::END_OF_STREAM).cast::<u16>().write(1);
            p.add(abi::FLUSH).cast::<u16>().write(0);
            p.add(abi::GZIP_FLAG).cast::<u16>().write(flag);
            let r = (l.stateless)(p.cast());
            (r, p.add(abi::TOTAL_OUT).cast::<u32>().read())
        };
        (r == abi::COMP_OK && total <= avail_out).then_some(total as usize)
    }
}
