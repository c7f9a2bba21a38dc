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
