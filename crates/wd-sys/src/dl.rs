//! Loading an optional part of WrapDrive at run time (the dynamic loader):
//! how a client library that does not carry the embedded host finds one
//! when a program asks for it (`WD_HOST=embedded`), and how the host
//! probes an optional engine library (intel-ipsec-mb) that may be absent.
//!
//! A library loaded here is never unloaded: what it starts (a host's
//! threads) runs its code until the process ends.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::{Result, SysError};

/// A loaded shared object (kept loaded for the life of the process).
#[derive(Debug)]
pub struct Library {
    handle: NonNull<c_void>,
    path: String,
}

// SAFETY: a dlopen handle is a process-wide token; the loader serialises
// every use of it internally.
unsafe impl Send for Library {}
// SAFETY: as above; `Library` offers no mutation of the handle.
unsafe impl Sync for Library {}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the
    // loader, valid until the next dl* call on this thread; copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown loader error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The directory of the object (executable or shared library) holding
/// this copy of `wd-sys`: an optional part is installed next to the
/// library that loads it, whatever the program's search path.
///
/// The kernel's name of the file mapped at this code's address
/// (`/proc/self/maps`: absolute, whatever the process's current directory
/// and `argv[0]`), not dladdr's, which for the program itself is
/// `argv[0]`: a bare name (or anything the invoker chose) that would be
/// resolved against the current directory.
fn own_directory() -> Option<PathBuf> {
    let anchor = own_directory as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| {
        l.split_once(' ')
            .and_then(|(range, _)| range.split_once('-'))
            .and_then(|(s, e)| {
                Some((
                    usize::from_str_radix(s, 16).ok()?,
                    usize::from_str_radix(e, 16).ok()?,
                ))
            })
            .is_some_and(|(s, e)| (s..e).contains(&anchor))
    })?;
    // start-end perms offset dev inode   path
    let path = line.splitn(6, ' ').nth(5)?.trim_start();
    if !path.starts_with('/') || path.ends_with(" (deleted)") {
        return None;
    }
    Path::new(path).parent().map(|p| p.to_path_buf())
}

fn open_path(path: &str) -> std::result::Result<Library, String> {
    let c = CString::new(path).map_err(|_| format!("{path}: NUL in the name"))?;
    // SAFETY: c is a NUL-terminated path; loading runs the object's
    // initialisers, which is what loading an optional part means.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    match NonNull::new(h) {
        Some(handle) => Ok(Library {
            handle,
            path: path.to_string(),
        }),
        None => Err(last_dl_error()),
    }
}

/// Load `name` (e.g. `libwd_embedded.so`) from the directory of the object
/// holding this code, else through the loader's usual search. The error
/// says where it looked and why each attempt failed.
pub fn load_beside_self(name: &str) -> Result<Library> {
    let mut tried = Vec::new();
    if let Some(dir) = own_directory() {
        let p = dir.join(name);
        if p.exists() {
            match open_path(&p.to_string_lossy()) {
                Ok(l) => return Ok(l),
                Err(e) => tried.push(e),
            }
        }
    }
    match open_path(name) {
        Ok(l) => Ok(l),
        Err(e) => {
            tried.push(e);
            Err(SysError::Call {
                call: "dlopen",
                source: std::io::Error::new(std::io::ErrorKind::NotFound, tried.join("; ")),
            })
        }
    }
}

/// Load a system library by its name (e.g. `libIPSec_MB.so.1`) through the
/// loader's usual search: how an optional faster engine is probed at run
/// time, so that nothing needs it to be installed.
pub fn load_system(name: &str) -> Result<Library> {
    open_path(name).map_err(|e| SysError::Call {
        call: "dlopen",
        source: std::io::Error::new(std::io::ErrorKind::NotFound, e),
    })
}

/// An entry point of the form `int f(char *text, size_t len)`: it writes a
/// NUL-terminated text (a result, or an error message) and returns 0 or a
/// negative errno.
type TextFn = unsafe extern "C" fn(*mut c_char, usize) -> c_int;

impl Library {
    /// Where it was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The address of `symbol`, or `None` when the library lacks it. Turning
    /// it into a function pointer of the right C type is the caller's
    /// (unsafe) promise about the library's ABI.
    pub fn symbol(&self, symbol: &str) -> Option<NonNull<c_void>> {
        let c = CString::new(symbol).ok()?;
        // SAFETY: the handle is live (never closed); c is NUL-terminated.
        NonNull::new(unsafe { libc::dlsym(self.handle.as_ptr(), c.as_ptr()) })
    }

    /// Call the library's `int symbol(char *text, size_t len)` and return
    /// its status and text. The symbol must have exactly that C type (the
    /// contract of the optional part that exports it).
    pub fn call_text_fn(&self, symbol: &str, room: usize) -> Result<(c_int, String)> {
        let c = CString::new(symbol).map_err(|_| SysError::Invalid {
            call: "dlsym",
            what: "NUL in the symbol name",
        })?;
        // SAFETY: the handle is live (never closed); c is NUL-terminated.
        let f = unsafe { libc::dlsym(self.handle.as_ptr(), c.as_ptr()) };
        if f.is_null() {
            return Err(SysError::Call {
                call: "dlsym",
                source: std::io::Error::new(std::io::ErrorKind::NotFound, last_dl_error()),
            });
        }
        // SAFETY: the symbol is documented as `int f(char *, size_t)`; a
        // function pointer and a data pointer have one size on Linux.
        let f: TextFn = unsafe { std::mem::transmute::<*mut c_void, TextFn>(f) };
        let mut buf = vec![0u8; room.max(1)];
        // SAFETY: buf has room for `buf.len()` bytes, which is what f may write.
        let rc = unsafe { f(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok((rc, String::from_utf8_lossy(&buf[..end]).into_owned()))
    }
}

/// A `void f(const char *text)` exported by an object already loaded in
/// the process (looked up across all of them): how one WrapDrive library
/// hands a text to another without linking it.
#[derive(Clone, Copy, Debug)]
pub struct TextSink(unsafe extern "C" fn(*const c_char));

impl TextSink {
    /// The function named `symbol` of `library` if that library is loaded
    /// (see [`find_loaded`]). It must have exactly the C type
    /// `void symbol(const char *)`.
    pub fn find_loaded(library: &str, symbol: &str) -> Option<TextSink> {
        let f = find_loaded(library, symbol)?;
        // SAFETY: the symbol's documented type is `void f(const char *)`;
        // function and data pointers have one size on Linux.
        Some(TextSink(unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char)>(f.as_ptr())
        }))
    }

    /// Call it with `text`.
    pub fn send(&self, text: &CStr) {
        // SAFETY: text is NUL-terminated and outlives the call; the callee
        // only reads it (its contract).
        unsafe { (self.0)(text.as_ptr()) }
    }
}

/// The address of `symbol` of `library` (e.g. `libwd.so`) if that library
/// is loaded (global or local scope: a plugin's dependencies are not
/// global): looked up in the library itself, never in unrelated objects
/// that export the same name. Never loads anything. Calling it needs its
/// exact C type.
pub fn find_loaded(library: &str, symbol: &str) -> Option<NonNull<c_void>> {
    let sym = CString::new(symbol).ok()?;
    let lib = CString::new(library).ok()?;
    // SAFETY: RTLD_NOLOAD only returns an already loaded object (with one
    // more reference, kept: it is never unloaded); None when `library` is
    // not loaded, whoever else exports `symbol`.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    // SAFETY: h is a live handle; sym is NUL-terminated. The search starts
    // in the library itself (then its dependencies).
    let f = unsafe { libc::dlsym(h, sym.as_ptr()) };
    NonNull::new(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let e = load_beside_self("libwd_no_such_part.so").unwrap_err();
        assert!(e.to_string().contains("libwd_no_such_part.so"), "{e}");
    }

    #[test]
    fn system_libraries_and_their_symbols() {
        let libc6 = load_system("libc.so.6").expect("libc.so.6 is loaded in every process");
        assert!(libc6.symbol("getpid").is_some());
        assert!(libc6.symbol("wd__no_such_symbol").is_none());
        let e = load_system("libwd_no_such_part.so.1").unwrap_err();
        assert!(e.to_string().contains("libwd_no_such_part.so.1"), "{e}");
    }

    #[test]
    fn a_missing_symbol_or_library_finds_nothing() {
        assert!(TextSink::find_loaded("libwd_no_such_part.so", "wd__no_such_symbol").is_none());
        assert!(TextSink::find_loaded("libc.so.6", "wd__no_such_symbol").is_none());
    }
}
