//! The process-wide allocator of shareable memory, and an owned buffer type.
#![allow(unsafe_code)]

use std::sync::Mutex;
use wd_sys::devmem::DeviceSlice;

use wd_mem::{Allocator, Location};
use wd_proto::Status;

use crate::{ClientError, Result};

/// The allocator and the fork generation it belongs to.
static ALLOCATOR: Mutex<Option<(u64, Allocator)>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Allocator) -> T) -> T {
    let mut g = ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner());
    let generation = crate::fork_generation();
    if g.as_ref().is_some_and(|(gen, _)| *gen != generation) {
        // A forked child: the arenas are shared mappings it has in common
        // with the parent, so carving more out of them would hand both
        // processes the same pages. Start afresh; the inherited mappings
        // stay mapped (the child may still use what it had).
        if let Some((_, old)) = g.take() {
            std::mem::forget(old);
        }
    }
    let (_, a) = g.get_or_insert_with(|| (generation, Allocator::default()));
    f(a)
}

fn mem_err(e: wd_mem::MemError) -> ClientError {
    ClientError::new(Status::from_errno(e.errno()), e.to_string())
}

/// Allocate `size` bytes of shareable memory (whole pages; zeroed when
/// new, but memory freed earlier in the process comes back as it was
/// left), optionally on a NUMA node; returns its address.
pub fn alloc(size: usize, node: Option<u32>) -> Result<u64> {
    with(|a| a.alloc(size, node))
        .map(|p| p as u64)
        .map_err(mem_err)
}

/// Free memory from [`alloc`].
pub fn free(addr: u64) -> Result<()> {
    with(|a| a.free(addr as usize)).map_err(mem_err)
}

/// Which arena holds a range (for `share`).
pub(crate) fn locate(addr: u64, len: u64) -> Option<Location> {
    with(|a| a.locate(addr as usize, len as usize))
}

/// An owned buffer of shareable memory, freed on drop.
///
/// The device may write it while requests are in flight, so the buffer
/// hands out no slices; copy in and out instead.
#[derive(Debug)]
pub struct SharedBuf {
    addr: u64,
    len: u64,
}

impl SharedBuf {
    /// Allocate `len` bytes.
    pub fn new(len: usize) -> Result<SharedBuf> {
        Ok(SharedBuf {
            addr: alloc(len, None)?,
            len: len as u64,
        })
    }

    /// Allocate on a NUMA node.
    pub fn on_node(len: usize, node: u32) -> Result<SharedBuf> {
        Ok(SharedBuf {
            addr: alloc(len, Some(node))?,
            len: len as u64,
        })
    }

    /// Address (the IOVA a request names).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer as device memory (it is shared: the device may write it).
    fn mem(&self) -> DeviceSlice<'_> {
        // SAFETY: addr..addr+len is this live allocation, which stays mapped
        // while `self` is borrowed.
        unsafe { DeviceSlice::from_host_addr(self.addr, self.len as usize) }
    }

    /// Copy `data` in at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) {
        assert!(
            offset + data.len() as u64 <= self.len,
            "write beyond buffer"
        );
        self.mem().write_from(offset as usize, data);
    }

    /// Copy out `out.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        assert!(offset + out.len() as u64 <= self.len, "read beyond buffer");
        self.mem().read_into(offset as usize, out);
    }

    /// Copy out `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: u64, len: usize) -> Vec<u8> {
        assert!(offset + len as u64 <= self.len, "read beyond buffer");
        self.mem().read_to_vec(offset as usize, len)
    }

    /// The 32-bit word at `offset` (4-aligned), loaded atomically with
    /// Acquire: a word the device publishes after the bytes it guards (a
    /// completion's phase tag).
    pub fn load_u32(&self, offset: u64) -> u32 {
        assert!(offset + 4 <= self.len, "load beyond buffer");
        self.mem().load_u32(offset as usize)
    }

    /// Store the 32-bit word at `offset` (4-aligned) atomically with
    /// Release: the bytes written before it are visible to a device that
    /// sees it (a shadow doorbell).
    pub fn store_u32(&self, offset: u64, v: u32) {
        assert!(offset + 4 <= self.len, "store beyond buffer");
        self.mem().store_u32(offset as usize, v);
    }

    /// The whole contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len as usize];
        self.read(0, &mut v);
        v
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        let _ = free(self.addr);
    }
}
