//! What the stateful fuzz targets share: the input read as a program of
//! little-endian fields.

/// The input, read as little-endian fields (zeroes past its end, so every
/// input is a whole program).
pub struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Input<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, at: 0 }
    }

    /// Whether every byte was read.
    pub fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    /// Up to `n` bytes as they are (fewer at the end of the input).
    pub fn raw(&mut self, n: usize) -> &'a [u8] {
        let from = self.at.min(self.data.len());
        let n = n.min(self.data.len() - from);
        self.at = from + n;
        &self.data[from..from + n]
    }

    /// The next `n` (at most 8) bytes as a number.
    pub fn take(&mut self, n: usize) -> u64 {
        let mut v = 0u64;
        for k in 0..n {
            v |= (*self.data.get(self.at + k).unwrap_or(&0) as u64) << (8 * k);
        }
        self.at += n;
        v
    }

    /// A length byte (at most `max`), then that many bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (self.take(1) as usize).min(max);
        let end = (self.at + n).min(self.data.len());
        let v = self.data.get(self.at..end).unwrap_or(&[]).to_vec();
        self.at += n;
        v
    }

    /// As [`Input::bytes`], as text.
    pub fn text(&mut self, max: usize) -> String {
        String::from_utf8_lossy(&self.bytes(max)).into_owned()
    }

    /// One byte's low bit.
    pub fn flag(&mut self) -> bool {
        self.take(1) & 1 != 0
    }

    /// A number that is small most of the time (below `small`, a power of
    /// two), and `wide` bytes of anything now and then.
    pub fn mostly_small(&mut self, small: u32, wide: usize) -> u32 {
        let v = self.take(1) as u32;
        if v & 0x80 != 0 {
            self.take(wide) as u32
        } else {
            v & (small - 1)
        }
    }
}

/// zlib's C interface, as the drop-in zlib's fuzz targets call it: the
/// shim (`$WDZ_LIB`, else target/release/libwdz.so of this checkout,
/// which scripts/build-wdz.sh builds and scripts/fuzz.sh builds first)
/// and the system zlib. The shim is loaded on its own (not preloaded):
/// its calls to the system zlib go to the libz.so.1 it was linked with,
/// which is also the reference.
pub mod zlib {
    use std::ffi::{c_char, c_int, c_ulong, c_void};
    use std::sync::OnceLock;

    use wd_sys::dl::{load_system, Library};

    /// zlib's `z_stream` (zlib.h, LP64).
    #[repr(C)]
    pub struct ZStream {
        pub next_in: *const u8,
        pub avail_in: u32,
        pub total_in: c_ulong,
        pub next_out: *mut u8,
        pub avail_out: u32,
        pub total_out: c_ulong,
        pub msg: *const c_char,
        pub state: *mut c_void,
        pub zalloc: *mut c_void,
        pub zfree: *mut c_void,
        pub opaque: *mut c_void,
        pub data_type: c_int,
        pub adler: c_ulong,
        pub reserved: c_ulong,
    }

    impl ZStream {
        /// Before init: all zero (NULL pointers: zlib's own allocator).
        pub fn new() -> ZStream {
            // SAFETY: all-zero is a valid z_stream before init.
            unsafe { std::mem::zeroed() }
        }
    }

    impl Default for ZStream {
        fn default() -> ZStream {
            ZStream::new()
        }
    }

    /// The version the inits are given (zlib checks its first digit).
    pub const VERSION: &[u8] = b"1.2.13\0";
    /// `sizeof(z_stream)`, as the inits are given it.
    pub const STREAM_SIZE: c_int = std::mem::size_of::<ZStream>() as c_int;
    pub const Z_OK: c_int = 0;
    pub const Z_STREAM_END: c_int = 1;
    pub const Z_NEED_DICT: c_int = 2;
    pub const Z_DATA_ERROR: c_int = -3;
    pub const Z_BUF_ERROR: c_int = -5;

    /// The shim and the system zlib, loaded once.
    pub fn libraries() -> &'static (Library, Library) {
        static BOTH: OnceLock<(Library, Library)> = OnceLock::new();
        BOTH.get_or_init(|| {
            let path = std::env::var("WDZ_LIB").unwrap_or_else(|_| {
                concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/libwdz.so").to_string()
            });
            let shim = load_system(&path)
                .unwrap_or_else(|e| panic!("{path}: {e} (scripts/build-wdz.sh builds it)"));
            let system = load_system("libz.so.1").expect("the system zlib");
            (shim, system)
        })
    }

    /// `name` in `lib` as a function pointer of type `F` (panics when the
    /// library lacks it).
    ///
    /// # Safety
    /// `F` must be a function pointer type matching zlib.h's declaration
    /// of `name`; `lib` stays loaded while it is called (the libraries
    /// above are never unloaded).
    pub unsafe fn entry<F: Copy>(lib: &Library, name: &str) -> F {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = lib
            .symbol(name)
            .unwrap_or_else(|| panic!("{}: no {name}", lib.path()))
            .as_ptr();
        // SAFETY: the caller promises F is the pointer type of `name`'s C
        // declaration; sizes checked above.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }
}
