//! The system's own zlib (`libz.so.1`), loaded at run time: the reference
//! the engines are compared with, in tests (streams decode both ways) and
//! in `wd bench zip` (the speed every zlib user has today). Absent on a
//! machine without zlib, which then has no reference to report.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_ulong};

use crate::CodecError;

type Compress2 = unsafe extern "C" fn(*mut u8, *mut c_ulong, *const u8, c_ulong, c_int) -> c_int;
type Uncompress2 = unsafe extern "C" fn(*mut u8, *mut c_ulong, *const u8, *mut c_ulong) -> c_int;
type Version = unsafe extern "C" fn() -> *const std::ffi::c_char;

const Z_OK: c_int = 0;
const Z_MEM_ERROR: c_int = -4;
const Z_BUF_ERROR: c_int = -5;

/// The system zlib's one-shot calls.
pub struct StockZlib {
    compress2: Compress2,
    uncompress2: Uncompress2,
    version: String,
    _lib: wd_sys::dl::Library,
}

impl std::fmt::Debug for StockZlib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockZlib")
            .field("version", &self.version)
            .finish()
    }
}

impl StockZlib {
    /// Load it; `None` when the machine has no `libz.so.1` (or one
    /// without zlib 1.2.9's `uncompress2`).
    pub fn load() -> Option<StockZlib> {
        let lib = wd_sys::dl::load_system("libz.so.1").ok()?;
        let c = lib.symbol("compress2")?;
        let u = lib.symbol("uncompress2")?;
        let v = lib.symbol("zlibVersion")?;
        // SAFETY: zlib's documented C types for these three entry points
        // (zlib.h); the library stays loaded as long as `_lib`.
        let (compress2, uncompress2, version) = unsafe {
            (
                std::mem::transmute::<*mut std::ffi::c_void, Compress2>(c.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, Uncompress2>(u.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, Version>(v.as_ptr()),
            )
        };
        // SAFETY: zlibVersion returns a static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(version()) }
            .to_string_lossy()
            .into_owned();
        Some(StockZlib {
            compress2,
            uncompress2,
            version,
            _lib: lib,
        })
    }

    /// zlib's version string.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `compress2`: a zlib stream of `input` in `out`; the bytes written.
    pub fn compress(&self, level: i32, input: &[u8], out: &mut [u8]) -> Result<usize, CodecError> {
        let mut n = out.len() as c_ulong;
        // SAFETY: both buffers are valid for their lengths; zlib writes at
        // most `n` bytes and stores the count in `n`.
        let r = unsafe {
            (self.compress2)(
                out.as_mut_ptr(),
                &mut n,
                input.as_ptr(),
                input.len() as c_ulong,
                level,
            )
        };
        match r {
            Z_OK => Ok(n as usize),
            Z_BUF_ERROR => Err(CodecError::NoSpace),
            Z_MEM_ERROR => Err(CodecError::Memory),
            _ => Err(CodecError::Param),
        }
    }

    /// `uncompress2`: the zlib stream at the start of `input` into `out`;
    /// (input consumed, bytes written).
    pub fn decompress(&self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize), CodecError> {
        let mut n = out.len() as c_ulong;
        let mut used = input.len() as c_ulong;
        // SAFETY: as in `compress`; `used` is read and written by zlib.
        let r = unsafe { (self.uncompress2)(out.as_mut_ptr(), &mut n, input.as_ptr(), &mut used) };
        match r {
            Z_OK => Ok((used as usize, n as usize)),
            Z_BUF_ERROR if n as usize == out.len() => Err(CodecError::NoSpace),
            Z_MEM_ERROR => Err(CodecError::Memory),
            _ => Err(CodecError::Corrupt),
        }
    }
}
