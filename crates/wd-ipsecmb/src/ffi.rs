//! The library's C ABI: its job structure, the manager fields this crate
//! reads, and the calls made through them. Everything that trusts the
//! library's layout is here; what it cannot check by types it checks at
//! load time (each function pointer read from the manager must be one the
//! library exports under the name of the architecture it chose).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::NonNull;

use wd_sys::dl::Library;

use crate::{CbcJob, MbError};

/// Jobs per library call: its `IMB_MAX_BURST_SIZE`.
const MAX_BURST: usize = 128;

/// Longest message the library's CBC burst takes per job (its lanes keep
/// 16-bit lengths: 64 KiB and more is "Invalid cipher message length"),
/// in whole blocks.
const MAX_SEGMENT: usize = 0xfff0;

/// `IMB_JOB` of `intel-ipsec-mb.h` (ABI 1.x): 200 bytes, the fields this
/// crate sets named, the rest kept zero.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ImbJob {
    pub enc_keys: *const c_void,
    pub dec_keys: *const c_void,
    pub key_len_in_bytes: u64,
    pub src: *const u8,
    pub dst: *mut u8,
    pub cipher_start_src_offset_in_bytes: u64,
    pub msg_len_to_cipher_in_bytes: u64,
    pub hash_start_src_offset_in_bytes: u64,
    pub msg_len_to_hash_in_bytes: u64,
    pub iv: *const u8,
    pub iv_len_in_bytes: u64,
    pub auth_tag_output: *mut u8,
    pub auth_tag_output_len_in_bytes: u64,
    /// The hash-specific union (three words at most).
    pub hash_fields: [u64; 3],
    pub status: u32,
    pub cipher_mode: u32,
    pub cipher_direction: u32,
    pub hash_alg: u32,
    pub chain_order: u32,
    pub user_data: *mut c_void,
    pub user_data2: *mut c_void,
    pub cipher_func: usize,
    pub hash_func: usize,
    pub sgl_state: u32,
    pub cipher_fields: *mut c_void,
}

const _: () = assert!(std::mem::size_of::<ImbJob>() == 200);
const _: () = assert!(std::mem::offset_of!(ImbJob, status) == 128);
const _: () = assert!(std::mem::offset_of!(ImbJob, user_data) == 152);
const _: () = assert!(std::mem::offset_of!(ImbJob, cipher_fields) == 192);

impl ImbJob {
    pub(crate) const ZERO: ImbJob = ImbJob {
        enc_keys: std::ptr::null(),
        dec_keys: std::ptr::null(),
        key_len_in_bytes: 0,
        src: std::ptr::null(),
        dst: std::ptr::null_mut(),
        cipher_start_src_offset_in_bytes: 0,
        msg_len_to_cipher_in_bytes: 0,
        hash_start_src_offset_in_bytes: 0,
        msg_len_to_hash_in_bytes: 0,
        iv: std::ptr::null(),
        iv_len_in_bytes: 0,
        auth_tag_output: std::ptr::null_mut(),
        auth_tag_output_len_in_bytes: 0,
        hash_fields: [0; 3],
        status: 0,
        cipher_mode: 0,
        cipher_direction: 0,
        hash_alg: 0,
        chain_order: 0,
        user_data: std::ptr::null_mut(),
        user_data2: std::ptr::null_mut(),
        cipher_func: 0,
        hash_func: 0,
        sgl_state: 0,
        cipher_fields: std::ptr::null_mut(),
    };
}

// Values of the header's enums.
pub(crate) const CIPHER_CBC: u32 = 1;
pub(crate) const DIR_ENCRYPT: u32 = 1;
pub(crate) const AUTH_NULL: u32 = 8;
pub(crate) const ORDER_CIPHER_HASH: u32 = 1;
pub(crate) const STATUS_COMPLETED: u32 = 3;

// Offsets into `IMB_MGR`: its leading fields, and function pointers that
// the library only ever appends to (its ABI rule), so they stay put.
const MGR_FEATURES: usize = 8;
const MGR_USED_ARCH: usize = 56;
const MGR_ERRNO: usize = 60;
const MGR_KEYEXP: [usize; 3] = [112, 120, 128];
const MGR_SUBMIT_CIPHER_BURST: usize = 984;

/// The layout this binding assumes, as `(C expression, value)` pairs that a
/// test compares with the installed header's `offsetof`/`sizeof`.
pub(crate) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("sizeof(IMB_JOB)", size_of::<ImbJob>()),
        ("offsetof(IMB_JOB, enc_keys)", offset_of!(ImbJob, enc_keys)),
        ("offsetof(IMB_JOB, dec_keys)", offset_of!(ImbJob, dec_keys)),
        (
            "offsetof(IMB_JOB, key_len_in_bytes)",
            offset_of!(ImbJob, key_len_in_bytes),
        ),
        ("offsetof(IMB_JOB, src)", offset_of!(ImbJob, src)),
        ("offsetof(IMB_JOB, dst)", offset_of!(ImbJob, dst)),
        (
            "offsetof(IMB_JOB, cipher_start_src_offset_in_bytes)",
            offset_of!(ImbJob, cipher_start_src_offset_in_bytes),
        ),
        (
            "offsetof(IMB_JOB, msg_len_to_cipher_in_bytes)",
            offset_of!(ImbJob, msg_len_to_cipher_in_bytes),
        ),
        ("offsetof(IMB_JOB, iv)", offset_of!(ImbJob, iv)),
        (
            "offsetof(IMB_JOB, iv_len_in_bytes)",
            offset_of!(ImbJob, iv_len_in_bytes),
        ),
        ("offsetof(IMB_JOB, u)", offset_of!(ImbJob, hash_fields)),
        ("offsetof(IMB_JOB, status)", offset_of!(ImbJob, status)),
        (
            "offsetof(IMB_JOB, cipher_mode)",
            offset_of!(ImbJob, cipher_mode),
        ),
        (
            "offsetof(IMB_JOB, cipher_direction)",
            offset_of!(ImbJob, cipher_direction),
        ),
        ("offsetof(IMB_JOB, hash_alg)", offset_of!(ImbJob, hash_alg)),
        (
            "offsetof(IMB_JOB, chain_order)",
            offset_of!(ImbJob, chain_order),
        ),
        (
            "offsetof(IMB_JOB, user_data)",
            offset_of!(ImbJob, user_data),
        ),
        (
            "offsetof(IMB_JOB, sgl_state)",
            offset_of!(ImbJob, sgl_state),
        ),
        (
            "offsetof(IMB_JOB, cipher_fields)",
            offset_of!(ImbJob, cipher_fields),
        ),
        ("offsetof(IMB_MGR, features)", MGR_FEATURES),
        ("offsetof(IMB_MGR, used_arch)", MGR_USED_ARCH),
        ("offsetof(IMB_MGR, imb_errno)", MGR_ERRNO),
        ("offsetof(IMB_MGR, keyexp_128)", MGR_KEYEXP[0]),
        ("offsetof(IMB_MGR, keyexp_192)", MGR_KEYEXP[1]),
        ("offsetof(IMB_MGR, keyexp_256)", MGR_KEYEXP[2]),
        (
            "offsetof(IMB_MGR, submit_cipher_burst)",
            MGR_SUBMIT_CIPHER_BURST,
        ),
        ("IMB_CIPHER_CBC", CIPHER_CBC as usize),
        ("IMB_DIR_ENCRYPT", DIR_ENCRYPT as usize),
        ("IMB_AUTH_NULL", AUTH_NULL as usize),
        ("IMB_ORDER_CIPHER_HASH", ORDER_CIPHER_HASH as usize),
        ("IMB_STATUS_COMPLETED", STATUS_COMPLETED as usize),
    ]
}

type AllocFn = unsafe extern "C" fn(u64) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type InitAutoFn = unsafe extern "C" fn(*mut c_void, *mut c_int);
type VersionFn = unsafe extern "C" fn() -> *const c_char;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
type KeyExpFn = unsafe extern "C" fn(*const c_void, *mut c_void, *mut c_void);
type CipherBurstFn = unsafe extern "C" fn(*mut c_void, *mut ImbJob, u32, u32, u32, u32) -> u32;

/// The library's entry points, resolved once per process.
pub(crate) struct Api {
    /// Kept loaded for the life of the process.
    lib: Library,
    alloc: AllocFn,
    free: FreeFn,
    init_auto: InitAutoFn,
    strerror: StrerrorFn,
    pub version: String,
}

fn sym(lib: &Library, name: &str) -> Result<NonNull<c_void>, MbError> {
    lib.symbol(name)
        .ok_or_else(|| MbError::Abi(format!("the library has no symbol {name}")))
}

/// `ptr` as a C string, copied.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that stays valid for the call.
unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

impl Api {
    pub(crate) fn load(name: &str) -> Result<Api, MbError> {
        let lib =
            wd_sys::dl::load_system(name).map_err(|e| MbError::NotInstalled(e.to_string()))?;
        // SAFETY: each symbol below is declared in intel-ipsec-mb.h with
        // exactly the C type it is cast to here; function and data
        // pointers have one size on Linux.
        let alloc = unsafe {
            std::mem::transmute::<*mut c_void, AllocFn>(sym(&lib, "alloc_mb_mgr")?.as_ptr())
        };
        // SAFETY: as above.
        let free = unsafe {
            std::mem::transmute::<*mut c_void, FreeFn>(sym(&lib, "free_mb_mgr")?.as_ptr())
        };
        // SAFETY: as above.
        let init_auto = unsafe {
            std::mem::transmute::<*mut c_void, InitAutoFn>(sym(&lib, "init_mb_mgr_auto")?.as_ptr())
        };
        // SAFETY: as above.
        let strerror = unsafe {
            std::mem::transmute::<*mut c_void, StrerrorFn>(sym(&lib, "imb_get_strerror")?.as_ptr())
        };
        // SAFETY: as above.
        let version_fn = unsafe {
            std::mem::transmute::<*mut c_void, VersionFn>(
                sym(&lib, "imb_get_version_str")?.as_ptr(),
            )
        };
        // SAFETY: returns a static NUL-terminated string.
        let version = unsafe { text(version_fn()) };
        Ok(Api {
            lib,
            alloc,
            free,
            init_auto,
            strerror,
            version,
        })
    }

    fn strerror(&self, errno: c_int) -> String {
        // SAFETY: returns a static NUL-terminated string for any value.
        unsafe { text((self.strerror)(errno)) }
    }

    pub(crate) fn library(&self) -> &Library {
        &self.lib
    }
}

/// Architecture names as the library's symbols spell them, by `IMB_ARCH`.
fn arch_name(arch: c_int) -> Option<&'static str> {
    match arch {
        2 => Some("sse"),
        3 => Some("avx"),
        4 => Some("avx2"),
        5 => Some("avx512"),
        _ => None,
    }
}

/// One multi-buffer manager: the library's per-thread scheduler state,
/// with the entry points of the architecture it picked.
pub(crate) struct Manager {
    api: &'static Api,
    mgr: NonNull<c_void>,
    /// Set once `new` has checked them (a manager that fails the checks
    /// is freed without ever being used).
    keyexp: Option<[KeyExpFn; 3]>,
    burst: Option<CipherBurstFn>,
    /// `avx2-t1` and the like: the code path the library chose.
    pub flavour: String,
    pub features: u64,
}

impl Manager {
    /// Allocate a manager and let the library pick the best code for this
    /// CPU (its own detection), then check that the entry points read from
    /// it are the ones the library exports for that choice.
    pub(crate) fn new(api: &'static Api) -> Result<Manager, MbError> {
        // SAFETY: alloc_mb_mgr(flags) takes any flags value; 0 = defaults.
        let mgr = NonNull::new(unsafe { (api.alloc)(0) })
            .ok_or_else(|| MbError::Init("alloc_mb_mgr returned NULL".into()))?;
        // Freed by Manager's Drop on every return below, the errors included.
        let mut m = Manager {
            api,
            mgr,
            keyexp: None,
            burst: None,
            flavour: String::new(),
            features: 0,
        };
        let mut arch: c_int = 0;
        // SAFETY: mgr is a fresh manager; arch is writable.
        unsafe { (api.init_auto)(mgr.as_ptr(), &mut arch) };
        let errno = m.field::<c_int>(MGR_ERRNO);
        if errno != 0 {
            return Err(MbError::Init(format!(
                "init_mb_mgr_auto: {}",
                api.strerror(errno)
            )));
        }
        m.features = m.field::<u64>(MGR_FEATURES);
        let used = m.field::<u32>(MGR_USED_ARCH);
        let Some(arch_s) = arch_name(arch).filter(|_| used as c_int == arch) else {
            return Err(MbError::Init(format!(
                "no usable architecture (IMB_ARCH {arch})"
            )));
        };
        let lib = api.library();
        let burst_ptr = m.field::<*mut c_void>(MGR_SUBMIT_CIPHER_BURST);
        let flavour = ["", "_t1", "_t2", "_t3"].iter().find_map(|t| {
            let s = lib.symbol(&format!("submit_cipher_burst_{arch_s}{t}"))?;
            (s.as_ptr() == burst_ptr).then(|| format!("{arch_s}{}", t.replace('_', "-")))
        });
        m.flavour = flavour.ok_or_else(|| {
            MbError::Abi(format!(
                "the manager's cipher burst entry is not the library's {arch_s} one (an ABI this crate does not know)"
            ))
        })?;
        let mut keyexp = [None; 3];
        for (i, bits) in [128, 192, 256].into_iter().enumerate() {
            let p = m.field::<*mut c_void>(MGR_KEYEXP[i]);
            let expected = lib.symbol(&format!("aes_keyexp_{bits}_{arch_s}"));
            if p.is_null() || expected.map(|e| e.as_ptr()) != Some(p) {
                return Err(MbError::Abi(format!(
                    "the manager's aes_keyexp_{bits} entry is not the library's {arch_s} one"
                )));
            }
            // SAFETY: checked equal to the exported aes_keyexp_<bits>_<arch>,
            // declared `void (const void *, void *, void *)`.
            keyexp[i] = Some(unsafe { std::mem::transmute::<*mut c_void, KeyExpFn>(p) });
        }
        m.keyexp = Some(keyexp.map(|k| k.expect("all three checked above")));
        // SAFETY: checked equal to the exported submit_cipher_burst_<flavour>,
        // whose type is the header's submit_cipher_burst_t.
        m.burst = Some(unsafe { std::mem::transmute::<*mut c_void, CipherBurstFn>(burst_ptr) });
        Ok(m)
    }

    /// A field of the manager at byte offset `off` (one of the `MGR_*`
    /// offsets, each naturally aligned for its type).
    fn field<T: Copy>(&self, off: usize) -> T {
        // SAFETY: mgr points to a live IMB_MGR (imb_get_mb_mgr_size bytes,
        // far beyond every MGR_* offset), initialised by init_mb_mgr_auto
        // before any field is read; the MGR_* fields are aligned words.
        unsafe { self.mgr.as_ptr().cast::<u8>().add(off).cast::<T>().read() }
    }

    /// Expand an AES key (16, 24 or 32 bytes) into encryption and
    /// decryption schedules of 15 round keys each.
    pub(crate) fn expand(
        &self,
        key: &[u8],
        enc: &mut [u8; 240],
        dec: &mut [u8; 240],
    ) -> Result<(), MbError> {
        let i = match key.len() {
            16 => 0,
            24 => 1,
            32 => 2,
            n => return Err(MbError::KeyLength(n)),
        };
        let keyexp = self.keyexp.expect("a Manager is returned checked")[i];
        // SAFETY: key holds key.len() bytes, the length this function reads;
        // enc and dec have room for the 15 round keys the largest key needs
        // (the callers keep them 16-byte aligned, as the library requires).
        unsafe {
            keyexp(
                key.as_ptr().cast::<c_void>(),
                enc.as_mut_ptr().cast::<c_void>(),
                dec.as_mut_ptr().cast::<c_void>(),
            )
        };
        Ok(())
    }

    /// AES-CBC-encrypt `jobs` side by side: one burst per key size and
    /// 128 jobs; each job's IV becomes the one that continues its message.
    pub(crate) fn cbc_encrypt(&mut self, jobs: &mut [CbcJob<'_>]) -> Result<(), MbError> {
        let mut burst: Vec<ImbJob> = Vec::with_capacity(MAX_BURST.min(jobs.len()));
        let mut live: Vec<usize> = Vec::with_capacity(MAX_BURST.min(jobs.len()));
        for key_len in [16usize, 24, 32] {
            let picked: Vec<usize> = (0..jobs.len())
                .filter(|&i| jobs[i].key.key_len == key_len && !jobs[i].src.is_empty())
                .collect();
            for chunk in picked.chunks(MAX_BURST) {
                // The library takes at most MAX_SEGMENT bytes of a message
                // per job: longer ones go in segments, each continuing from
                // the IV the one before left.
                let mut off = 0usize;
                loop {
                    live.clear();
                    live.extend(chunk.iter().copied().filter(|&i| jobs[i].src.len() > off));
                    if live.is_empty() {
                        break;
                    }
                    burst.clear();
                    burst.extend(live.iter().map(|&i| {
                        let j = &jobs[i];
                        let n = (j.src.len() - off).min(MAX_SEGMENT);
                        ImbJob {
                            enc_keys: j.key.enc.0.as_ptr().cast(),
                            dec_keys: j.key.dec.0.as_ptr().cast(),
                            key_len_in_bytes: key_len as u64,
                            src: j.src.subslice(off, n).as_ptr(),
                            dst: j.dst.subslice(off, n).as_ptr(),
                            msg_len_to_cipher_in_bytes: n as u64,
                            iv: j.iv.as_ptr(),
                            iv_len_in_bytes: 16,
                            cipher_mode: CIPHER_CBC,
                            cipher_direction: DIR_ENCRYPT,
                            hash_alg: AUTH_NULL,
                            chain_order: ORDER_CIPHER_HASH,
                            ..ImbJob::ZERO
                        }
                    }));
                    // SAFETY: each job points into a live Schedule (16-byte
                    // aligned round keys), its own `iv` and two DeviceSlices
                    // (live device memory of their lengths by DeviceSlice's
                    // contract; `CbcJob::new` checked dst holds src's length),
                    // all borrowed through `jobs` for this call.
                    unsafe {
                        self.cipher_burst(&mut burst, CIPHER_CBC, DIR_ENCRYPT, key_len as u32)
                    }?;
                    for &i in &live {
                        let j = &mut jobs[i];
                        let end = j.src.len().min(off + MAX_SEGMENT);
                        j.dst.read_into(end - 16, &mut j.iv);
                    }
                    off += MAX_SEGMENT;
                }
            }
        }
        Ok(())
    }

    /// Run `jobs` (all of one key size, at most 128) as one burst.
    ///
    /// # Safety
    /// Every job's keys, IV, source and destination must be valid for the
    /// lengths it gives for the duration of the call.
    unsafe fn cipher_burst(
        &mut self,
        jobs: &mut [ImbJob],
        mode: u32,
        dir: u32,
        key_len: u32,
    ) -> Result<(), MbError> {
        let n = jobs.len() as u32;
        let burst = self.burst.expect("a Manager is returned checked");
        // SAFETY: mgr is live and used by this thread only (Manager is not
        // Send); the jobs are valid (the caller's promise).
        let done = unsafe { burst(self.mgr.as_ptr(), jobs.as_mut_ptr(), n, mode, dir, key_len) };
        let errno = self.field::<c_int>(MGR_ERRNO);
        if done != n || errno != 0 || jobs.iter().any(|j| j.status != STATUS_COMPLETED) {
            return Err(MbError::Burst {
                done,
                of: n,
                reason: self.api.strerror(errno),
            });
        }
        Ok(())
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        // SAFETY: mgr came from alloc_mb_mgr and is freed once, here.
        unsafe { (self.api.free)(self.mgr.as_ptr()) };
    }
}
