//! The sec device's message format (`device_api` 1): algorithms, opcodes,
//! flags and the descriptor payload layouts, with the one decoder of
//! untrusted descriptors. Pure logic, shared by the device and clients
//! (its own crate so a client speaks it without linking the device).
//!
//! Every payload field is little-endian at a fixed offset (see each
//! message's `encode`); bytes not named by a message must be zero.
#![deny(unsafe_code)]

use wd_ring::{Desc, PAYLOAD_SIZE};

/// Message-format version a client must speak.
pub const DEVICE_API: u32 = 1;

/// Opcode: nothing (measures the queue).
pub const OP_NOP: u16 = 0;
/// Opcode: create a session ([`SessionNew`]); `result` is its handle.
pub const OP_SESSION_NEW: u16 = 1;
/// Opcode: destroy a session ([`SessionFree`]).
pub const OP_SESSION_FREE: u16 = 2;
/// Opcode: encrypt or decrypt ([`CipherOp`]); `result` is bytes written.
pub const OP_CIPHER: u16 = 3;
/// Opcode: digest or MAC ([`DigestOp`]); `result` is digest bytes written.
pub const OP_DIGEST: u16 = 4;
/// Opcode: a new session holding a copy of a digest or HMAC session's
/// state ([`SessionClone`]), a message under way included; `result` is
/// its handle. What a copied digest context needs (an application's
/// `EVP_MD_CTX_copy`, python's `hashlib` on every `digest()`) once its
/// message streams on the device, whose state lives only in the host.
pub const OP_SESSION_CLONE: u16 = 5;

/// Cipher flag: encrypt (else decrypt).
pub const F_ENCRYPT: u16 = 1;
/// Cipher flag: start a new message with the descriptor's IV (CBC IV,
/// CTR counter block, XTS tweak, GCM nonce); without it the session
/// continues where its previous request stopped (chaining).
pub const F_IV: u16 = 2;
/// Cipher flag (AEAD): finish the message: produce the tag (encrypt) or
/// check it (decrypt). With [`F_IV`] too, the request is one whole
/// message and a decryption releases no plaintext unless the tag matches.
pub const F_FINAL: u16 = 4;
/// Digest flag: restart the session's state before this data.
pub const F_INIT: u16 = 1;
/// Digest flag: after this data, write the digest and restart.
pub const F_DIGEST_FINAL: u16 = 2;

/// Longest key a session takes (XTS-256: two 32-byte keys; HMAC keys may
/// be longer and are then passed by address).
pub const MAX_KEY: usize = 1024;
/// Key bytes that fit in the descriptor itself.
pub const INLINE_KEY: usize = 64;
/// Largest data length of one request.
pub const MAX_DATA: u64 = 64 << 20;
/// Largest AEAD additional data of one request.
pub const MAX_AAD: u32 = 1 << 16;
/// Sessions one queue may hold.
pub const MAX_SESSIONS: usize = 4096;
/// Largest digest (SHA-512).
pub const MAX_DIGEST: usize = 64;
/// Longest IV carried in a descriptor.
pub const MAX_IV: usize = 16;

/// Block cipher mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Electronic codebook.
    Ecb,
    /// Cipher block chaining.
    Cbc,
    /// Counter.
    Ctr,
    /// XEX with ciphertext stealing (storage).
    Xts,
    /// Galois/counter mode (AEAD).
    Gcm,
}

/// Hash function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hash {
    /// SHA-1.
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

impl Hash {
    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha224 => 28,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// Input block size in bytes (HMAC key padding).
    pub fn block_size(self) -> usize {
        match self {
            Hash::Sha384 | Hash::Sha512 => 128,
            _ => 64,
        }
    }

    /// OpenSSL's name of the function.
    pub fn openssl_name(self) -> &'static str {
        match self {
            Hash::Sha1 => "SHA1",
            Hash::Sha224 => "SHA224",
            Hash::Sha256 => "SHA256",
            Hash::Sha384 => "SHA384",
            Hash::Sha512 => "SHA512",
        }
    }
}

/// Every algorithm of the device. The numeric id travels in descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alg {
    /// A block cipher: AES with a key of `key_bits` in `mode`.
    Aes {
        /// 128, 192 or 256 (XTS: 128 or 256 per half).
        key_bits: u16,
        /// Mode of operation.
        mode: Mode,
    },
    /// A plain digest.
    Digest(Hash),
    /// HMAC over a digest.
    Hmac(Hash),
}

/// Every algorithm, in id order (the id is the index + 1).
pub const ALGS: [Alg; 23] = [
    Alg::Aes {
        key_bits: 128,
        mode: Mode::Ecb,
    },
    Alg::Aes {
        key_bits: 192,
        mode: Mode::Ecb,
    },
    Alg::Aes {
        key_bits: 256,
        mode: Mode::Ecb,
    },
    Alg::Aes {
        key_bits: 128,
        mode: Mode::Cbc,
    },
    Alg::Aes {
        key_bits: 192,
        mode: Mode::Cbc,
    },
    Alg::Aes {
        key_bits: 256,
        mode: Mode::Cbc,
    },
    Alg::Aes {
        key_bits: 128,
        mode: Mode::Ctr,
    },
    Alg::Aes {
        key_bits: 192,
        mode: Mode::Ctr,
    },
    Alg::Aes {
        key_bits: 256,
        mode: Mode::Ctr,
    },
    Alg::Aes {
        key_bits: 128,
        mode: Mode::Xts,
    },
    Alg::Aes {
        key_bits: 256,
        mode: Mode::Xts,
    },
    Alg::Aes {
        key_bits: 128,
        mode: Mode::Gcm,
    },
    Alg::Aes {
        key_bits: 256,
        mode: Mode::Gcm,
    },
    Alg::Digest(Hash::Sha1),
    Alg::Digest(Hash::Sha224),
    Alg::Digest(Hash::Sha256),
    Alg::Digest(Hash::Sha384),
    Alg::Digest(Hash::Sha512),
    Alg::Hmac(Hash::Sha1),
    Alg::Hmac(Hash::Sha224),
    Alg::Hmac(Hash::Sha256),
    Alg::Hmac(Hash::Sha384),
    Alg::Hmac(Hash::Sha512),
];

/// OpenSSL's other names for algorithms of [`ALGS`], and the name
/// [`Alg::name`] gives each.
const ALIASES: [(&str, &str); 15] = [
    ("aes128", "aes-128-cbc"),
    ("aes192", "aes-192-cbc"),
    ("aes256", "aes-256-cbc"),
    ("sha-1", "sha1"),
    ("ssl3-sha1", "sha1"),
    ("sha2-224", "sha224"),
    ("sha-224", "sha224"),
    ("sha2-256", "sha256"),
    ("sha-256", "sha256"),
    ("sha2-384", "sha384"),
    ("sha-384", "sha384"),
    ("sha2-512", "sha512"),
    ("sha-512", "sha512"),
    ("id-aes128-gcm", "aes-128-gcm"),
    ("id-aes256-gcm", "aes-256-gcm"),
];

impl Alg {
    /// The id carried in descriptors.
    pub fn id(self) -> u16 {
        ALGS.iter()
            .position(|&a| a == self)
            .expect("every Alg is in ALGS") as u16
            + 1
    }

    /// The algorithm of an id.
    pub fn from_id(id: u16) -> Option<Alg> {
        ALGS.get((id as usize).checked_sub(1)?).copied()
    }

    /// Name as users write it (OpenSSL's spelling, lower case):
    /// `aes-128-cbc`, `sha256`, `hmac-sha256`.
    pub fn name(self) -> String {
        match self {
            Alg::Aes { key_bits, mode } => {
                let m = match mode {
                    Mode::Ecb => "ecb",
                    Mode::Cbc => "cbc",
                    Mode::Ctr => "ctr",
                    Mode::Xts => "xts",
                    Mode::Gcm => "gcm",
                };
                format!("aes-{key_bits}-{m}")
            }
            Alg::Digest(h) => h.openssl_name().to_lowercase(),
            Alg::Hmac(h) => format!("hmac-{}", h.openssl_name().to_lowercase()),
        }
    }

    /// Look an algorithm up by [`Alg::name`] or one of the other names
    /// OpenSSL gives it (`AES128`, `SHA2-256`, `SHA-256`: the provider
    /// registers them too), case-insensitive.
    pub fn by_name(name: &str) -> Option<Alg> {
        let name = ALIASES
            .iter()
            .find(|(alias, _)| alias.eq_ignore_ascii_case(name))
            .map_or(name, |&(_, canonical)| canonical);
        ALGS.iter()
            .copied()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// Key length a session needs (0: a plain digest; HMAC: any length up
    /// to [`MAX_KEY`], reported as 0 here).
    pub fn key_len(self) -> usize {
        match self {
            Alg::Aes { key_bits, mode } => {
                let k = key_bits as usize / 8;
                if mode == Mode::Xts {
                    2 * k
                } else {
                    k
                }
            }
            _ => 0,
        }
    }

    /// IV length (0 when the mode has none; GCM: the 12-byte nonce).
    pub fn iv_len(self) -> usize {
        match self {
            Alg::Aes {
                mode: Mode::Ecb, ..
            } => 0,
            Alg::Aes {
                mode: Mode::Gcm, ..
            } => 12,
            Alg::Aes { .. } => 16,
            _ => 0,
        }
    }

    /// Bytes a request's length must be a multiple of (ECB and CBC work on
    /// whole blocks; the client library buffers partial blocks).
    pub fn granule(self) -> u64 {
        match self {
            Alg::Aes {
                mode: Mode::Ecb | Mode::Cbc,
                ..
            } => 16,
            _ => 1,
        }
    }

    /// Whether this is a cipher (served by the `cipher` queue type).
    pub fn is_cipher(self) -> bool {
        matches!(self, Alg::Aes { .. })
    }

    /// Output length of a digest or MAC (0 for ciphers).
    pub fn digest_len(self) -> usize {
        match self {
            Alg::Digest(h) | Alg::Hmac(h) => h.digest_len(),
            Alg::Aes { .. } => 0,
        }
    }

    /// OpenSSL's name of the cipher or digest behind this algorithm.
    pub fn openssl_name(self) -> String {
        match self {
            Alg::Aes { .. } => self.name().to_uppercase(),
            Alg::Digest(h) | Alg::Hmac(h) => h.openssl_name().to_string(),
        }
    }
}

/// Why a descriptor was refused (each maps to a negative errno status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// A field is out of its range or reserved bytes are not zero.
    #[error("invalid field: {0}")]
    Invalid(&'static str),
    /// The request is larger than the device takes.
    #[error("request too large: {0}")]
    TooBig(&'static str),
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    Opcode(u16),
}

impl MsgError {
    /// The completion status for this error.
    pub fn status(self) -> i32 {
        use wd_msg::status;
        match self {
            MsgError::Invalid(_) => status::EINVAL,
            MsgError::TooBig(_) => status::EMSGSIZE,
            MsgError::Opcode(_) => status::EOPNOTSUPP,
        }
    }
}

/// Create a session for `alg` with `key`: inline when it fits
/// ([`INLINE_KEY`]), else read from `key_addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionNew {
    /// Algorithm.
    pub alg: Alg,
    /// Key length.
    pub key_len: u16,
    /// Where the key is when it is not inline (0 otherwise).
    pub key_addr: u64,
    /// The key when inline (first `key_len` bytes).
    pub inline_key: [u8; INLINE_KEY],
}

/// Destroy a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionFree {
    /// The handle `OP_SESSION_NEW` returned.
    pub session: u64,
}

/// Copy a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionClone {
    /// The handle of the session copied.
    pub session: u64,
}

/// Encrypt or decrypt `len` bytes from `src` to `dst` (they may be equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CipherOp {
    /// Session handle.
    pub session: u64,
    /// `F_ENCRYPT | F_IV | F_FINAL`.
    pub flags: u16,
    /// Source address.
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
    /// IV (first `iv_len` bytes), used with [`F_IV`].
    pub iv: [u8; MAX_IV],
    /// IV length used with [`F_IV`].
    pub iv_len: u8,
    /// AEAD additional data address.
    pub aad: u64,
    /// AEAD additional data length.
    pub aad_len: u32,
    /// AEAD tag address (written on encrypt, read on decrypt, with [`F_FINAL`]).
    pub tag: u64,
    /// AEAD tag length (4..=16).
    pub tag_len: u8,
}

/// Hash or MAC `len` bytes at `src`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestOp {
    /// Session handle; 0 for a session-less one-shot plain digest of `alg`.
    pub session: u64,
    /// Algorithm of a session-less request.
    pub alg: Option<Alg>,
    /// `F_INIT | F_DIGEST_FINAL`.
    pub flags: u16,
    /// Data address.
    pub src: u64,
    /// Data length.
    pub len: u64,
    /// Where the digest goes with [`F_DIGEST_FINAL`].
    pub out: u64,
}

/// A decoded sec request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Nothing.
    Nop,
    /// Session creation.
    SessionNew(SessionNew),
    /// Session destruction.
    SessionFree(SessionFree),
    /// Session copy.
    SessionClone(SessionClone),
    /// Cipher work.
    Cipher(CipherOp),
    /// Digest work.
    Digest(DigestOp),
}

fn u64_at(p: &[u8; PAYLOAD_SIZE], o: usize) -> u64 {
    u64::from_le_bytes(p[o..o + 8].try_into().expect("8 bytes"))
}
fn u32_at(p: &[u8; PAYLOAD_SIZE], o: usize) -> u32 {
    u32::from_le_bytes(p[o..o + 4].try_into().expect("4 bytes"))
}
fn u16_at(p: &[u8; PAYLOAD_SIZE], o: usize) -> u16 {
    u16::from_le_bytes(p[o..o + 2].try_into().expect("2 bytes"))
}
fn zero(p: &[u8; PAYLOAD_SIZE], from: usize, to: usize) -> Result<(), MsgError> {
    if p[from..to].iter().any(|&b| b != 0) {
        return Err(MsgError::Invalid("reserved payload bytes"));
    }
    Ok(())
}

fn desc(opcode: u16, flags: u16) -> Desc {
    Desc {
        opcode,
        flags,
        ..Desc::default()
    }
}

// Payload offsets.
// SessionNew: alg u16 @0, key_len u16 @2, key_addr u64 @8, key @16..80.
// SessionFree: session u64 @0.
// Cipher: session @0, src @8, dst @16, len @24, iv @32..48, aad @48,
//         aad_len u32 @56, tag_len u8 @60, iv_len u8 @61, tag @64.
// Digest: session @0, src @8, out @16, len @24, alg u16 @32.

impl SessionNew {
    /// A request for `alg` with `key` (inline when short, else by address).
    pub fn new(alg: Alg, key: &[u8], key_addr: u64) -> SessionNew {
        let mut inline_key = [0u8; INLINE_KEY];
        if key.len() <= INLINE_KEY {
            inline_key[..key.len()].copy_from_slice(key);
        }
        SessionNew {
            alg,
            key_len: key.len().min(u16::MAX as usize) as u16,
            key_addr: if key.len() <= INLINE_KEY { 0 } else { key_addr },
            inline_key,
        }
    }

    /// The descriptor.
    pub fn encode(&self) -> Desc {
        let mut d = desc(OP_SESSION_NEW, 0);
        d.payload[0..2].copy_from_slice(&self.alg.id().to_le_bytes());
        d.payload[2..4].copy_from_slice(&self.key_len.to_le_bytes());
        d.payload[8..16].copy_from_slice(&self.key_addr.to_le_bytes());
        d.payload[16..80].copy_from_slice(&self.inline_key);
        d
    }
}

impl SessionFree {
    /// The descriptor.
    pub fn encode(&self) -> Desc {
        let mut d = desc(OP_SESSION_FREE, 0);
        d.set_payload_u64(0, self.session);
        d
    }
}

impl SessionClone {
    /// The descriptor.
    pub fn encode(&self) -> Desc {
        let mut d = desc(OP_SESSION_CLONE, 0);
        d.set_payload_u64(0, self.session);
        d
    }
}

impl CipherOp {
    /// The descriptor.
    pub fn encode(&self) -> Desc {
        let mut d = desc(OP_CIPHER, self.flags);
        d.set_payload_u64(0, self.session);
        d.set_payload_u64(8, self.src);
        d.set_payload_u64(16, self.dst);
        d.set_payload_u64(24, self.len);
        d.payload[32..48].copy_from_slice(&self.iv);
        d.set_payload_u64(48, self.aad);
        d.payload[56..60].copy_from_slice(&self.aad_len.to_le_bytes());
        d.payload[60] = self.tag_len;
        d.payload[61] = self.iv_len;
        d.set_payload_u64(64, self.tag);
        d
    }
}

impl DigestOp {
    /// The descriptor.
    pub fn encode(&self) -> Desc {
        let mut d = desc(OP_DIGEST, self.flags);
        d.set_payload_u64(0, self.session);
        d.set_payload_u64(8, self.src);
        d.set_payload_u64(16, self.out);
        d.set_payload_u64(24, self.len);
        let alg = self.alg.map_or(0, Alg::id);
        d.payload[32..34].copy_from_slice(&alg.to_le_bytes());
        d
    }
}

/// Decode an untrusted descriptor: the only place sec requests are parsed.
/// Checks everything that does not need session state: known opcode and
/// flags, lengths within the named limits, reserved bytes zero.
pub fn decode(d: &Desc) -> Result<Request, MsgError> {
    if d.reserved != 0 {
        return Err(MsgError::Invalid("descriptor reserved word"));
    }
    let p = &d.payload;
    match d.opcode {
        OP_NOP => {
            if d.flags != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            Ok(Request::Nop)
        }
        OP_SESSION_NEW => {
            if d.flags != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            let alg = Alg::from_id(u16_at(p, 0)).ok_or(MsgError::Invalid("algorithm"))?;
            let key_len = u16_at(p, 2);
            zero(p, 4, 8)?;
            zero(p, 80, PAYLOAD_SIZE)?;
            let key_addr = u64_at(p, 8);
            if key_len as usize > MAX_KEY {
                return Err(MsgError::TooBig("key"));
            }
            let expect = alg.key_len();
            let ok = match alg {
                Alg::Digest(_) => key_len == 0,
                Alg::Hmac(_) => true,
                Alg::Aes { .. } => key_len as usize == expect,
            };
            if !ok {
                return Err(MsgError::Invalid("key length for the algorithm"));
            }
            let inline = key_len as usize <= INLINE_KEY;
            if inline && key_addr != 0 {
                return Err(MsgError::Invalid("key address with an inline key"));
            }
            let mut inline_key = [0u8; INLINE_KEY];
            inline_key.copy_from_slice(&p[16..80]);
            if inline && inline_key[key_len as usize..].iter().any(|&b| b != 0) {
                return Err(MsgError::Invalid("bytes after the inline key"));
            }
            Ok(Request::SessionNew(SessionNew {
                alg,
                key_len,
                key_addr,
                inline_key,
            }))
        }
        OP_SESSION_FREE => {
            if d.flags != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            zero(p, 8, PAYLOAD_SIZE)?;
            Ok(Request::SessionFree(SessionFree {
                session: u64_at(p, 0),
            }))
        }
        OP_SESSION_CLONE => {
            if d.flags != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            zero(p, 8, PAYLOAD_SIZE)?;
            Ok(Request::SessionClone(SessionClone {
                session: u64_at(p, 0),
            }))
        }
        OP_CIPHER => {
            if d.flags & !(F_ENCRYPT | F_IV | F_FINAL) != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            zero(p, 62, 64)?;
            zero(p, 72, PAYLOAD_SIZE)?;
            let op = CipherOp {
                session: u64_at(p, 0),
                flags: d.flags,
                src: u64_at(p, 8),
                dst: u64_at(p, 16),
                len: u64_at(p, 24),
                iv: p[32..48].try_into().expect("16 bytes"),
                aad: u64_at(p, 48),
                aad_len: u32_at(p, 56),
                tag_len: p[60],
                iv_len: p[61],
                tag: u64_at(p, 64),
            };
            if op.len > MAX_DATA {
                return Err(MsgError::TooBig("data length"));
            }
            if op.aad_len > MAX_AAD {
                return Err(MsgError::TooBig("additional data length"));
            }
            if op.iv_len as usize > MAX_IV {
                return Err(MsgError::Invalid("IV length"));
            }
            if op.flags & F_IV == 0 && op.iv_len != 0 {
                return Err(MsgError::Invalid("IV length without F_IV"));
            }
            if op.tag_len > 16 {
                return Err(MsgError::Invalid("tag length"));
            }
            Ok(Request::Cipher(op))
        }
        OP_DIGEST => {
            if d.flags & !(F_INIT | F_DIGEST_FINAL) != 0 {
                return Err(MsgError::Invalid("flags"));
            }
            zero(p, 34, PAYLOAD_SIZE)?;
            let session = u64_at(p, 0);
            let alg_id = u16_at(p, 32);
            let alg = match (session, alg_id) {
                (0, id) => match Alg::from_id(id) {
                    Some(a @ Alg::Digest(_)) => Some(a),
                    _ => return Err(MsgError::Invalid("session-less digest algorithm")),
                },
                (_, 0) => None,
                _ => return Err(MsgError::Invalid("algorithm with a session")),
            };
            if session == 0 && d.flags != F_INIT | F_DIGEST_FINAL {
                return Err(MsgError::Invalid("a session-less digest is one-shot"));
            }
            let op = DigestOp {
                session,
                alg,
                flags: d.flags,
                src: u64_at(p, 8),
                out: u64_at(p, 16),
                len: u64_at(p, 24),
            };
            if op.len > MAX_DATA {
                return Err(MsgError::TooBig("data length"));
            }
            Ok(Request::Digest(op))
        }
        other => Err(MsgError::Opcode(other)),
    }
}

/// How a request travels on the legacy (socket) path: which client ranges
/// are gathered, in order, into the request payload, which are scattered
/// back from the reply, and the descriptor rewritten to name offsets into
/// those payloads instead of client addresses.
pub fn legacy_plan(d: &Desc) -> Result<wd_msg::LegacyPlan, MsgError> {
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut off = 0u64;
    let mut input = |addr: u64, len: u64| -> u64 {
        let at = off;
        if len > 0 {
            inputs.push((addr, len));
            off += len;
        }
        at
    };
    let desc = match decode(d)? {
        Request::Nop | Request::SessionFree(_) | Request::SessionClone(_) => *d,
        Request::SessionNew(mut s) => {
            if s.key_addr != 0 {
                s.key_addr = input(s.key_addr, s.key_len as u64);
            }
            let mut n = s.encode();
            n.tag = d.tag;
            n
        }
        Request::Cipher(mut c) => {
            let (src, dst, len) = (c.src, c.dst, c.len);
            c.src = input(src, len);
            c.aad = input(c.aad, c.aad_len as u64);
            let decrypt_tag = c.flags & F_ENCRYPT == 0 && c.flags & F_FINAL != 0;
            let tag_addr = c.tag;
            if decrypt_tag {
                c.tag = input(tag_addr, c.tag_len as u64);
            }
            // Outputs land at the start of the reply payload.
            c.dst = 0;
            outputs.push((dst, len));
            if c.flags & F_ENCRYPT != 0 && c.flags & F_FINAL != 0 {
                c.tag = len;
                outputs.push((tag_addr, c.tag_len as u64));
            }
            let mut n = c.encode();
            n.tag = d.tag;
            n
        }
        Request::Digest(mut g) => {
            let out = g.out;
            g.src = input(g.src, g.len);
            g.out = 0;
            if g.flags & F_DIGEST_FINAL != 0 {
                // The digest length is known only to the session; the
                // reply carries exactly what was produced (result bytes).
                outputs.push((out, MAX_DIGEST as u64));
            }
            let mut n = g.encode();
            n.tag = d.tag;
            n
        }
    };
    Ok(wd_msg::LegacyPlan {
        inputs,
        outputs,
        desc,
    })
}

/// [`legacy_plan`] as a queue takes it (`Queue::set_legacy_planner`):
/// a malformed request completes with its status.
pub const LEGACY_PLANNER: wd_msg::LegacyPlanner = |d| legacy_plan(d).map_err(MsgError::status);

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenSSL's other names find the same algorithm (the provider
    /// answers to them, and `wd speed --digest sha2-256` was refused);
    /// every alias names an algorithm.
    #[test]
    fn openssl_aliases_name_the_same_algorithms() {
        for (alias, canonical) in super::ALIASES {
            let a = Alg::by_name(alias).expect(alias);
            assert_eq!(a.name(), canonical);
            assert_eq!(Alg::by_name(&alias.to_uppercase()), Some(a));
        }
        assert_eq!(Alg::by_name("SHA2-256").unwrap().name(), "sha256");
        assert_eq!(Alg::by_name("aes128").unwrap().name(), "aes-128-cbc");
        assert_eq!(Alg::by_name("sha2-999"), None);
    }

    #[test]
    fn ids_and_names_round_trip() {
        for a in ALGS {
            assert_eq!(Alg::from_id(a.id()), Some(a));
            assert_eq!(Alg::by_name(&a.name()), Some(a));
        }
        assert_eq!(Alg::from_id(0), None);
        assert_eq!(Alg::from_id(ALGS.len() as u16 + 1), None);
        assert_eq!(Alg::by_name("AES-128-CBC").unwrap().key_len(), 16);
        assert_eq!(Alg::by_name("aes-256-xts").unwrap().key_len(), 64);
        assert_eq!(Alg::by_name("hmac-sha384").unwrap().digest_len(), 48);
    }

    #[test]
    fn messages_round_trip() {
        let alg = Alg::by_name("aes-128-gcm").unwrap();
        let s = SessionNew::new(alg, &[7; 16], 0);
        assert_eq!(decode(&s.encode()), Ok(Request::SessionNew(s)));
        let c = CipherOp {
            session: 9,
            flags: F_ENCRYPT | F_IV | F_FINAL,
            src: 1,
            dst: 2,
            len: 3,
            iv: [5; 16],
            iv_len: 12,
            aad: 4,
            aad_len: 5,
            tag: 6,
            tag_len: 16,
        };
        assert_eq!(decode(&c.encode()), Ok(Request::Cipher(c)));
        let g = DigestOp {
            session: 0,
            alg: Some(Alg::Digest(Hash::Sha256)),
            flags: F_INIT | F_DIGEST_FINAL,
            src: 1,
            len: 2,
            out: 3,
        };
        assert_eq!(decode(&g.encode()), Ok(Request::Digest(g)));
        let k = SessionClone { session: 77 };
        assert_eq!(decode(&k.encode()), Ok(Request::SessionClone(k)));
    }

    #[test]
    fn bad_requests_are_refused() {
        let alg = Alg::by_name("aes-128-cbc").unwrap();
        // Wrong key length.
        let s = SessionNew::new(alg, &[7; 15], 0);
        assert!(matches!(decode(&s.encode()), Err(MsgError::Invalid(_))));
        // Unknown algorithm, reserved bytes, unknown opcode and flags.
        let mut d = SessionNew::new(alg, &[7; 16], 0).encode();
        d.payload[0] = 200;
        assert!(decode(&d).is_err());
        let mut d = SessionFree { session: 1 }.encode();
        d.payload[90] = 1;
        assert!(decode(&d).is_err());
        let d = Desc {
            opcode: 77,
            ..Desc::default()
        };
        assert_eq!(decode(&d), Err(MsgError::Opcode(77)));
        let mut d = SessionFree { session: 1 }.encode();
        d.flags = 8;
        assert!(decode(&d).is_err());
        let mut d = SessionClone { session: 1 }.encode();
        d.payload[8] = 1;
        assert!(decode(&d).is_err());
        let mut d = SessionClone { session: 1 }.encode();
        d.flags = 1;
        assert!(decode(&d).is_err());
        // A session-less digest must be one-shot and of a plain digest.
        let g = DigestOp {
            session: 0,
            alg: Some(Alg::Hmac(Hash::Sha1)),
            flags: F_INIT | F_DIGEST_FINAL,
            src: 0,
            len: 0,
            out: 0,
        };
        assert!(decode(&g.encode()).is_err());
        let g = DigestOp {
            alg: Some(Alg::Digest(Hash::Sha1)),
            flags: F_INIT,
            ..g
        };
        assert!(decode(&g.encode()).is_err());
        // Oversized data.
        let c = CipherOp {
            session: 1,
            flags: 0,
            src: 0,
            dst: 0,
            len: MAX_DATA + 1,
            iv: [0; 16],
            iv_len: 0,
            aad: 0,
            aad_len: 0,
            tag: 0,
            tag_len: 0,
        };
        assert_eq!(decode(&c.encode()).unwrap_err().status(), -90);
    }
}
