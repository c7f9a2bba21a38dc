//! Callers' `wd_alloc` buffers reached in place. `wd_alloc` is libwd.so's
//! allocator, another copy of the client library than the one linked into
//! this library, so its arenas are found through libwd.so's private
//! `wd__arena_of` (version node `WD_PRIVATE`).

use std::ffi::c_int;
use std::sync::{Once, OnceLock};

use wrapdrive::ForeignArena;

/// `int wd__arena_of(uint64_t addr, uint64_t len, uint64_t *base,
/// uint64_t *size, int *fd)`.
type ArenaOf = unsafe extern "C" fn(u64, u64, *mut u64, *mut u64, *mut c_int) -> c_int;

fn arena_of() -> Option<ArenaOf> {
    static F: OnceLock<Option<ArenaOf>> = OnceLock::new();
    *F.get_or_init(|| {
        let f = wd_sys::dl::find_loaded("libwd.so", "wd__arena_of")?;
        // SAFETY: libwd.so exports wd__arena_of with exactly this C type;
        // function and data pointers have one size on Linux.
        Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, ArenaOf>(f.as_ptr()) })
    })
}

fn lookup(addr: u64, len: u64) -> Option<ForeignArena> {
    let f = arena_of()?;
    let (mut base, mut size, mut fd) = (0u64, 0u64, -1);
    // SAFETY: the three out-pointers are live locals; wd__arena_of writes
    // them only on success.
    let r = unsafe { f(addr, len, &mut base, &mut size, &mut fd) };
    (r == 0).then_some(ForeignArena { base, size, fd })
}

/// Let the crypto library find `wd_alloc`'s arenas (once per process).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    // SAFETY: libwd.so's arenas are never unmapped and their memfds never
    // closed (its allocator keeps every arena for the life of the process),
    // which is what wd__arena_of reports.
    ONCE.call_once(|| unsafe { wrapdrive::set_foreign_arenas(lookup) });
}
