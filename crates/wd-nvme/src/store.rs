//! Namespaces: ranges of backing files or block devices, and the
//! subsystem that owns them and says which controller each is attached to.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use wd_sys::file::{FileInfo, FileKind};

/// Errors of namespace set-up.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A namespace specification could not be parsed.
    #[error("namespace '{spec}': {why} (expected PATH:OFFSET:SIZE[:BLOCK], sizes like 64M or 1G, BLOCK 512 or 4096)")]
    Spec {
        /// The specification.
        spec: String,
        /// What was wrong.
        why: String,
    },
    /// The backing store could not be opened or sized.
    #[error("namespace '{spec}': {path}: {source}")]
    Open {
        /// The specification.
        spec: String,
        /// The backing path.
        path: PathBuf,
        /// What the system said.
        source: wd_sys::SysError,
    },
    /// Two namespaces share blocks of one store.
    #[error("namespaces '{a}' and '{b}' overlap on the same store")]
    Overlap {
        /// One namespace.
        a: String,
        /// The other.
        b: String,
    },
    /// No namespace has that id.
    #[error("no namespace {nsid}")]
    NoSuchNamespace {
        /// The id.
        nsid: u32,
    },
    /// The namespace is in use.
    #[error("namespace {nsid} is attached to controller {controller}; detach it first")]
    Attached {
        /// The id.
        nsid: u32,
        /// Its controller.
        controller: u16,
    },
    /// Too many namespaces.
    #[error("at most {max} namespaces")]
    TooMany {
        /// The limit.
        max: usize,
    },
}

/// Most namespaces one device serves (NSIDs 1..=MAX_NAMESPACES).
pub const MAX_NAMESPACES: usize = 1024;

/// What a namespace specification says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// Backing file or block device.
    pub path: PathBuf,
    /// Byte offset of the namespace in the store.
    pub offset: u64,
    /// Bytes of the namespace.
    pub size: u64,
    /// Logical block size (512 or 4096).
    pub block: u64,
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

impl std::str::FromStr for NamespaceSpec {
    type Err = StoreError;

    /// `PATH:OFFSET:SIZE[:BLOCK]`; the path may itself contain colons.
    fn from_str(spec: &str) -> Result<Self, StoreError> {
        let bad = |why: &str| StoreError::Spec {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let parts: Vec<&str> = spec.rsplitn(4, ':').collect();
        // rsplitn gives the fields last first.
        let (path, offset, size, block) = match parts.as_slice() {
            // Four size-like fields are OFFSET:SIZE:BLOCK whatever BLOCK
            // says: a wrong BLOCK (8192, 1024) is refused as such, not
            // read as a path ending in ":OFFSET" (which made a file named
            // "store.img:0" for "store.img:0:1G:8192").
            [b, s, o, p]
                if parse_size(b).is_some()
                    && parse_size(s).is_some()
                    && parse_size(o).is_some() =>
            {
                (*p, *o, *s, Some(*b))
            }
            [s, o, p, rest] => (&spec[..rest.len() + 1 + p.len()], *o, *s, None),
            [s, o, p] => (*p, *o, *s, None),
            _ => return Err(bad("too few fields")),
        };
        let offset = parse_size(offset).ok_or_else(|| bad("bad OFFSET"))?;
        let size = parse_size(size).ok_or_else(|| bad("bad SIZE"))?;
        let block = match block {
            None => 4096,
            Some(b) => parse_size(b).ok_or_else(|| bad("bad BLOCK"))?,
        };
        if path.is_empty() {
            return Err(bad("empty PATH"));
        }
        if block != 512 && block != 4096 {
            return Err(bad("BLOCK must be 512 or 4096"));
        }
        if size == 0 || size % block != 0 || offset % block != 0 {
            return Err(bad("OFFSET and SIZE must be non-zero multiples of BLOCK"));
        }
        offset
            .checked_add(size)
            .ok_or_else(|| bad("OFFSET + SIZE overflows"))?;
        Ok(NamespaceSpec {
            path: PathBuf::from(path),
            offset,
            size,
            block,
        })
    }
}

/// One namespace: its blocks in a store.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace id (1-based).
    pub nsid: u32,
    /// The specification it came from (for messages and `wd ls`).
    pub spec: NamespaceSpec,
    /// The store opened for buffered I/O.
    buffered: OwnedFd,
    /// The store opened with O_DIRECT, when the store allows it.
    direct: Option<OwnedFd>,
    /// Alignment O_DIRECT needs of memory and of file offsets and lengths.
    dio_align: (u64, u64),
    /// log2 of the block size.
    pub lbads: u8,
    /// Why O_DIRECT is not used, when it is not.
    pub buffered_why: Option<String>,
    /// The specification as written.
    pub text: String,
    /// Its blocks, held against every other namespace of the process.
    _claim: Claim,
    /// Globally unique id (from the store's identity and the offset).
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
}

impl Namespace {
    /// Blocks in the namespace.
    pub fn blocks(&self) -> u64 {
        self.spec.size >> self.lbads
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.spec.block
    }

    /// Whether I/O goes around the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The descriptor to use for `len` bytes at namespace byte `off` from
    /// or to memory at host address `mem`: O_DIRECT when everything is
    /// aligned as it needs, buffered otherwise. Returns the descriptor and
    /// the store offset.
    pub fn fd_for(&self, off: u64, len: u64, mem: u64) -> (BorrowedFd<'_>, u64) {
        let at = self.spec.offset + off;
        match &self.direct {
            Some(d) if self.aligned(off, len, mem) => (d.as_fd(), at),
            _ => (self.buffered.as_fd(), at),
        }
    }

    /// Whether a transfer can go around the page cache.
    pub fn aligned(&self, off: u64, len: u64, mem: u64) -> bool {
        let at = self.spec.offset + off;
        self.direct.is_some()
            && mem % self.dio_align.0 == 0
            && at % self.dio_align.1 == 0
            && len % self.dio_align.1 == 0
    }

    /// The buffered descriptor and the store offset of namespace byte
    /// `off` (for zeroing, deallocating and flushing).
    pub fn buffered_at(&self, off: u64) -> (BorrowedFd<'_>, u64) {
        (self.buffered.as_fd(), self.spec.offset + off)
    }

    /// One line for `wd ls`.
    pub fn describe(&self) -> String {
        format!(
            "ns{} {}:{}:{} ({} B blocks, {})",
            self.nsid,
            self.spec.path.display(),
            self.spec.offset,
            self.spec.size,
            self.spec.block,
            match &self.buffered_why {
                None => "O_DIRECT".to_string(),
                Some(w) => format!("buffered: {w}"),
            }
        )
    }
}

fn open_store(spec: &NamespaceSpec, text: &str) -> Result<(OwnedFd, FileInfo), StoreError> {
    let err = |source| StoreError::Open {
        spec: text.to_string(),
        path: spec.path.clone(),
        source,
    };
    let device_dir = spec.path.parent().is_some_and(|d| {
        d == Path::new("/dev") || d.starts_with("/dev/disk") || d.starts_with("/dev/mapper")
    });
    if !spec.path.exists() && !device_dir {
        // A missing store is created, empty and sparse (a missing device
        // node is an error: a typo must not become a file in /dev).
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&spec.path)
            .map_err(|e| StoreError::Open {
                spec: text.to_string(),
                path: spec.path.clone(),
                source: wd_sys::SysError::Call {
                    call: "create",
                    source: e,
                },
            })?;
    }
    let fd = wd_sys::file::open_rw(&spec.path, false).map_err(err)?;
    let info = wd_sys::file::file_info(fd.as_fd()).map_err(err)?;
    let end = spec.offset + spec.size;
    match info.kind {
        // Grown once the namespaces are known not to overlap.
        FileKind::Regular => {}
        FileKind::Block if info.size < end => {
            return Err(StoreError::Spec {
                spec: text.to_string(),
                why: format!("the block device has only {} bytes", info.size),
            })
        }
        FileKind::Block => {}
        _ => {
            return Err(StoreError::Spec {
                spec: text.to_string(),
                why: "not a regular file or block device".into(),
            })
        }
    }
    Ok((fd, info))
}

fn open_direct(
    path: &Path,
    buffered: BorrowedFd<'_>,
    block: u64,
) -> Result<(OwnedFd, (u64, u64)), String> {
    // A store in memory gains nothing from O_DIRECT (it is a copy either
    // way) and loses the page cache's synchronous fast path.
    if let Ok((magic, _)) = wd_sys::file::fs_of(buffered) {
        if magic == 0x0102_1994 || magic == 0x8584_58f6 {
            return Err(format!(
                "the store is memory ({})",
                wd_sys::file::fs_name(magic)
            ));
        }
    }
    // EINVAL: the filesystem (tmpfs, say) has no O_DIRECT.
    let fd = wd_sys::file::open_rw(path, true).map_err(|e| match e.errno() {
        22 => "the filesystem refuses O_DIRECT".to_string(),
        _ => e.to_string(),
    })?;
    // The store's own alignment (statx); 512 where it does not say.
    let direct_info = wd_sys::file::file_info(fd.as_fd()).map_err(|e| e.to_string())?;
    let mem = (direct_info.dio_mem_align as u64).max(4);
    let off = match direct_info.dio_offset_align as u64 {
        0 => 512,
        a => a,
    };
    if off > block {
        return Err(format!(
            "the store's O_DIRECT alignment ({off} B) exceeds the block size"
        ));
    }
    Ok((fd, (mem, off)))
}

/// The namespaces of one device and which controller each is attached to
/// (a namespace is private: one controller at a time). Namespaces come and
/// go at run time (`add`, `remove`); a controller keeps the ones it
/// attached, so its I/O takes no lock here.
#[derive(Debug)]
pub struct Subsystem {
    state: Mutex<State>,
    /// The NVM subsystem's identity, which every controller of it
    /// reports: its NVMe Qualified Name (Identify SUBNQN) and serial
    /// number (SN), both made from one random UUID.
    nqn: String,
    serial: String,
}

impl Default for Subsystem {
    fn default() -> Self {
        let uuid = random_uuid();
        Subsystem {
            state: Mutex::default(),
            nqn: uuid_nqn(&uuid),
            serial: uuid_serial(&uuid),
        }
    }
}

/// A serial number (20 ASCII characters at most) unique to the subsystem:
/// "WD" and 72 bits of its UUID in hex, which a driver or udev keys
/// devices by (two devices of one host must not share it).
fn uuid_serial(uuid: &[u8; 16]) -> String {
    // Bytes 7 to 15 of a version 4 UUID: random but for byte 8's two
    // variant bits (byte 6 carries the version).
    let tail = uuid[7..16].iter().fold(String::new(), |mut s, b| {
        s.push_str(&format!("{b:02X}"));
        s
    });
    format!("WD{tail}")
}

/// The UUID-based NQN (NVMe Base 4.7, the format for a name with no
/// naming authority behind it): hosts tell NVM subsystems apart by their
/// NQN, so each device of each host needs its own, which a fixed
/// domain-based name cannot give without a registry of them.
fn uuid_nqn(uuid: &[u8; 16]) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}",
        hex(&uuid[..4]),
        hex(&uuid[4..6]),
        hex(&uuid[6..8]),
        hex(&uuid[8..10]),
        hex(&uuid[10..])
    )
}

/// A random (version 4, RFC 9562) UUID.
fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut u = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut u));
    if read.is_err() {
        // No /dev/urandom (a sandbox without it): the standard library's
        // hash keys come from the system's randomness too, and each
        // RandomState has its own.
        use std::hash::{BuildHasher, Hasher};
        for half in u.chunks_exact_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.write_u32(std::process::id());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    u[6] = u[6] & 0x0f | 0x40;
    u[8] = u[8] & 0x3f | 0x80;
    u
}

#[derive(Debug, Default)]
struct State {
    /// By NSID - 1; a removed namespace leaves a free slot.
    namespaces: Vec<Option<Arc<Namespace>>>,
    /// NSID -> controller id.
    attached: HashMap<u32, u16>,
    /// Controller ids in use: attachments name a controller by its id
    /// only, so an id is never given again while its controller lives.
    live: HashSet<u16>,
    /// Where the search for the next id starts.
    next: u16,
}

/// Blocks of a store a namespace holds. Two namespaces on the same store
/// (device and inode) must not share a block, whichever device of the
/// host serves them: else two clients each given a "private" namespace
/// read and write the same bytes. Held for the namespace's life.
#[derive(Debug)]
struct Claim {
    id: u64,
}

/// (claim id, store, first byte, end, the namespace as written).
type Claimed = (u64, ((u32, u32), u64), u64, u64, String);

/// What the namespaces of this process hold.
static CLAIMS: Mutex<Vec<Claimed>> = Mutex::new(Vec::new());

impl Claim {
    fn take(
        store: ((u32, u32), u64),
        start: u64,
        end: u64,
        text: &str,
    ) -> Result<Claim, StoreError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let mut all = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(other) = all
            .iter()
            .find(|c| c.1 == store && start < c.3 && c.2 < end)
        {
            return Err(StoreError::Overlap {
                a: other.4.clone(),
                b: text.to_string(),
            });
        }
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        all.push((id, store, start, end, text.to_string()));
        Ok(Claim { id })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        CLAIMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c.0 != self.id);
    }
}

/// Highest controller id (0xfff0 and above are reserved).
const MAX_CNTLID: u16 = 0xffef;

impl Subsystem {
    /// Open every namespace of `specs` (NSIDs in order from 1), refusing
    /// overlaps on one store, with these or with any other namespace of
    /// the process.
    pub fn open(specs: &[String]) -> Result<Subsystem, StoreError> {
        let sub = Subsystem::default();
        for text in specs {
            sub.add(text)?;
        }
        Ok(sub)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add the namespace `text` (`PATH:OFFSET:SIZE[:BLOCK]`) under the
    /// lowest free NSID, which is returned.
    pub fn add(&self, text: &str) -> Result<u32, StoreError> {
        let spec: NamespaceSpec = text.parse()?;
        let (buffered, info) = open_store(&spec, text)?;
        let mut st = self.state();
        let slot = match st.namespaces.iter().position(Option::is_none) {
            Some(i) => i,
            None if st.namespaces.len() < MAX_NAMESPACES => st.namespaces.len(),
            None => {
                return Err(StoreError::TooMany {
                    max: MAX_NAMESPACES,
                })
            }
        };
        let identity = (info.dev, info.ino);
        let (a0, a1) = (spec.offset, spec.offset + spec.size);
        let claim = Claim::take(identity, a0, a1, text)?;
        if info.kind == FileKind::Regular {
            wd_sys::file::grow_to(buffered.as_fd(), a1).map_err(|source| StoreError::Open {
                spec: text.to_string(),
                path: spec.path.clone(),
                source,
            })?;
        }
        let (direct, dio_align, buffered_why) =
            match open_direct(&spec.path, buffered.as_fd(), spec.block) {
                Ok((fd, align)) => (Some(fd), align, None),
                Err(why) => (None, (1, 1), Some(why)),
            };
        let nsid = slot as u32 + 1;
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&info.ino.to_be_bytes());
        nguid[8..].copy_from_slice(&spec.offset.to_be_bytes());
        nguid[0] ^= info.dev.0 as u8;
        nguid[1] ^= info.dev.1 as u8;
        let mut eui64 = [0u8; 8];
        // Locally administered, WrapDrive's "WD" prefix, the NSID.
        eui64[..3].copy_from_slice(&[0x02, 0x57, 0x44]);
        eui64[4..].copy_from_slice(&nsid.to_be_bytes());
        let ns = Arc::new(Namespace {
            nsid,
            lbads: spec.block.trailing_zeros() as u8,
            spec,
            text: text.to_string(),
            _claim: claim,
            buffered,
            direct,
            dio_align,
            buffered_why,
            nguid,
            eui64,
        });
        if slot == st.namespaces.len() {
            st.namespaces.push(Some(ns));
        } else {
            st.namespaces[slot] = Some(ns);
        }
        Ok(nsid)
    }

    /// Remove namespace `nsid` (not while a controller has it attached).
    pub fn remove(&self, nsid: u32) -> Result<(), StoreError> {
        let mut st = self.state();
        let slot = nsid.checked_sub(1).map(|i| i as usize);
        let exists = slot
            .and_then(|i| st.namespaces.get(i))
            .is_some_and(Option::is_some);
        if !exists {
            return Err(StoreError::NoSuchNamespace { nsid });
        }
        if let Some(&c) = st.attached.get(&nsid) {
            return Err(StoreError::Attached {
                nsid,
                controller: c,
            });
        }
        let i = slot.expect("checked");
        st.namespaces[i] = None;
        while st.namespaces.last().is_some_and(Option::is_none) {
            st.namespaces.pop();
        }
        Ok(())
    }

    /// Every namespace, by NSID.
    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        self.state().namespaces.iter().flatten().cloned().collect()
    }

    /// The NVM subsystem's NQN (Identify SUBNQN), the same on each of its
    /// controllers and unique to this device.
    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    /// The NVM subsystem's serial number (Identify SN), as [`Self::nqn`].
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// The largest NSID in use (Identify's NN).
    pub fn max_nsid(&self) -> u32 {
        self.state().namespaces.len() as u32
    }

    /// Namespace `nsid`, if it exists.
    pub fn get(&self, nsid: u32) -> Option<Arc<Namespace>> {
        let i = nsid.checked_sub(1)? as usize;
        self.state().namespaces.get(i)?.clone()
    }

    /// Attach `nsid` to controller `cntlid`, returning it: Err(Some(other))
    /// when another controller has it, Err(None) when this one has it
    /// already or it does not exist.
    pub fn attach(&self, nsid: u32, cntlid: u16) -> Result<Arc<Namespace>, Option<u16>> {
        let mut st = self.state();
        let ns = nsid
            .checked_sub(1)
            .and_then(|i| st.namespaces.get(i as usize).cloned().flatten())
            .ok_or(None)?;
        match st.attached.get(&nsid) {
            Some(&c) if c == cntlid => Err(None),
            Some(&c) => Err(Some(c)),
            None => {
                st.attached.insert(nsid, cntlid);
                Ok(ns)
            }
        }
    }

    /// Detach `nsid` from `cntlid`; false when it was not attached there.
    pub fn detach(&self, nsid: u32, cntlid: u16) -> bool {
        let mut st = self.state();
        if st.attached.get(&nsid) == Some(&cntlid) {
            st.attached.remove(&nsid);
            true
        } else {
            false
        }
    }

    /// An id for a new controller, none a live controller has (ids cycle
    /// through 1..=0xffef). `None` only when every id is in use, which the
    /// host's limit on a device's queues keeps far off.
    pub fn new_controller(&self) -> Option<u16> {
        let mut st = self.state();
        for _ in 0..MAX_CNTLID {
            st.next = if st.next >= MAX_CNTLID {
                1
            } else {
                st.next + 1
            };
            let id = st.next;
            if st.live.insert(id) {
                return Some(id);
            }
        }
        None
    }

    /// The controller `cntlid` is gone (its client, or the queue, is):
    /// its namespaces are free for another controller, and its id for a
    /// new one.
    pub fn controller_gone(&self, cntlid: u16) {
        let mut st = self.state();
        st.attached.retain(|_, c| *c != cntlid);
        st.live.remove(&cntlid);
    }

    /// The controller `nsid` is attached to.
    pub fn owner(&self, nsid: u32) -> Option<u16> {
        self.state().attached.get(&nsid).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        let s: NamespaceSpec = "/tmp/a.img:1M:64M".parse().unwrap();
        assert_eq!((s.offset, s.size, s.block), (1 << 20, 64 << 20, 4096));
        let s: NamespaceSpec = "/tmp/x:y.img:0:8M:512".parse().unwrap();
        assert_eq!(s.path, PathBuf::from("/tmp/x:y.img"));
        assert_eq!(s.block, 512);
        let s: NamespaceSpec = "/tmp/x:y.img:0:8M".parse().unwrap();
        assert_eq!(s.path, PathBuf::from("/tmp/x:y.img"));
        for bad in [
            "/a:0",
            "/a:0:0",
            "/a:1:8M",
            "/a:0:8M:1024",
            "/a:0:1G:8192",
            ":0:4K",
            "/a:x:4K",
            "/a:0:8M:4096x",
        ] {
            assert!(bad.parse::<NamespaceSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn overlaps_refused_and_attachment_private() {
        let dir = std::env::temp_dir().join(format!("wd-nvme-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("store.img");
        std::fs::write(&f, b"").unwrap();
        let p = f.display();
        let e = Subsystem::open(&[format!("{p}:0:8M"), format!("{p}:4M:8M")]).unwrap_err();
        assert!(matches!(e, StoreError::Overlap { .. }), "{e}");
        let sub = Subsystem::open(&[format!("{p}:0:4M"), format!("{p}:4M:4M:512")]).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 8 << 20);
        assert_eq!(sub.get(2).unwrap().blocks(), 8192);
        assert!(sub.get(3).is_none() && sub.get(0).is_none());
        assert_eq!(sub.attach(1, 5).unwrap().nsid, 1);
        assert_eq!(sub.attach(1, 5).unwrap_err(), None);
        assert_eq!(sub.attach(1, 6).unwrap_err(), Some(5));
        assert!(!sub.detach(1, 6));
        // Not removable while attached; then its id is reused.
        assert!(matches!(
            sub.remove(1),
            Err(StoreError::Attached { controller: 5, .. })
        ));
        sub.controller_gone(5);
        assert_eq!(sub.owner(1), None);
        sub.remove(1).unwrap();
        assert!(sub.get(1).is_none());
        assert!(matches!(
            sub.remove(1),
            Err(StoreError::NoSuchNamespace { nsid: 1 })
        ));
        assert_eq!(sub.max_nsid(), 2);
        assert!(matches!(
            sub.add(&format!("{p}:4M:4K")),
            Err(StoreError::Overlap { .. })
        ));
        assert_eq!(sub.add(&format!("{p}:0:4M")).unwrap(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two devices of one host (two subsystems) may not serve the same
    /// blocks either: each would give a client the "private" namespace
    /// another client writes. A namespace gone gives its blocks back.
    #[test]
    fn overlaps_are_refused_across_subsystems() {
        let dir = std::env::temp_dir().join(format!("wd-nvme-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("store.img");
        std::fs::write(&f, b"").unwrap();
        let p = f.display();
        let one = Subsystem::open(&[format!("{p}:0:4M")]).unwrap();
        // The same path through a link is the same store.
        let link = dir.join("link.img");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        for spec in [format!("{p}:0:4M"), format!("{}:1M:4K", link.display())] {
            let e = Subsystem::open(std::slice::from_ref(&spec)).unwrap_err();
            assert!(matches!(e, StoreError::Overlap { .. }), "{spec}: {e}");
            assert!(e.to_string().contains(":0:4M"), "{e}");
        }
        let two = Subsystem::open(&[format!("{p}:4M:4M")]).unwrap();
        assert!(matches!(
            two.add(&format!("{p}:3M:2M")),
            Err(StoreError::Overlap { .. })
        ));
        one.remove(1).unwrap();
        assert_eq!(two.add(&format!("{p}:0:4M")).unwrap(), 2);
        drop(two);
        let three = Subsystem::open(&[format!("{p}:0:8M")]).unwrap();
        drop(three);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Attachments name a controller by its 16-bit id: a client cycling
    /// through queues must never be given the id of a live controller
    /// (it could then detach that controller's namespace and attach it).
    #[test]
    fn a_live_controllers_id_is_never_given_again() {
        let sub = Subsystem::default();
        let a = sub.new_controller().unwrap();
        for _ in 0..2 * MAX_CNTLID as u32 {
            let b = sub.new_controller().unwrap();
            assert!(b != a && (1..=MAX_CNTLID).contains(&b));
            sub.controller_gone(b);
        }
        sub.controller_gone(a);
        assert!((0..MAX_CNTLID).any(|_| {
            let b = sub.new_controller().unwrap();
            sub.controller_gone(b);
            b == a
        }));
    }
}
