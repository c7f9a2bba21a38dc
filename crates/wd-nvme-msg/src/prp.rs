//! Physical Region Page lists: where a command's data lies.
//!
//! A command names its data with PRP1 (the first page, which may start at
//! an offset) and PRP2: unused when the data ends in PRP1's page, the
//! second page when it ends there, otherwise a pointer to a list of page
//! addresses whose last entry on each list page points to the next list
//! page. Every entry but the first and the list pointer must be page
//! aligned; offsets must be dword (data) or qword (list) aligned.

/// Why a command's PRPs cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrpError<E> {
    /// An entry has an offset the rules forbid (status PRP Offset Invalid).
    #[error("PRP entry {entry:#x} has an invalid offset")]
    Offset {
        /// The entry.
        entry: u64,
    },
    /// A list page could not be read (status Data Transfer Error).
    #[error("PRP list at {at:#x} unreadable")]
    List {
        /// Address of the list entries.
        at: u64,
        /// What reading it said.
        cause: E,
    },
    /// The addresses wrap around the 64-bit space.
    #[error("PRP entry {entry:#x} wraps the address space")]
    Wraps {
        /// The entry.
        entry: u64,
    },
}

/// The data segments of one command: (address, length) runs, adjacent
/// pages merged.
pub type PrpSegments = Vec<(u64, u64)>;

fn push(out: &mut PrpSegments, addr: u64, len: u64) {
    if let Some(last) = out.last_mut() {
        if last.0.checked_add(last.1) == Some(addr) {
            last.1 += len;
            return;
        }
    }
    out.push((addr, len));
}

/// Walk the PRPs of a transfer of `len` bytes (> 0) with memory pages of
/// `page` bytes, appending its segments to `out` (cleared first).
/// `read_list(addr, entries)` reads list entries (little-endian u64s) from
/// the driver's memory.
pub fn walk<E>(
    prp1: u64,
    prp2: u64,
    len: u64,
    page: u64,
    mut read_list: impl FnMut(u64, &mut [u64]) -> Result<(), E>,
    out: &mut PrpSegments,
) -> Result<(), PrpError<E>> {
    out.clear();
    if len == 0 {
        return Ok(());
    }
    if prp1 & 3 != 0 {
        return Err(PrpError::Offset { entry: prp1 });
    }
    let first = len.min(page - prp1 % page);
    prp1.checked_add(first)
        .ok_or(PrpError::Wraps { entry: prp1 })?;
    push(out, prp1, first);
    let mut left = len - first;
    if left == 0 {
        return Ok(());
    }
    let data_page = |e: u64, left: u64, out: &mut PrpSegments| -> Result<u64, PrpError<E>> {
        if e % page != 0 {
            return Err(PrpError::Offset { entry: e });
        }
        let n = left.min(page);
        e.checked_add(n).ok_or(PrpError::Wraps { entry: e })?;
        push(out, e, n);
        Ok(left - n)
    };
    if left <= page {
        data_page(prp2, left, out)?;
        return Ok(());
    }
    if prp2 & 7 != 0 {
        return Err(PrpError::Offset { entry: prp2 });
    }
    let per_page = (page / 8) as usize;
    let mut list = prp2;
    let mut buf = vec![0u64; per_page];
    loop {
        let room = ((page - list % page) / 8) as usize;
        let pages_left = left.div_ceil(page) as usize;
        // The last slot of a list page chains to the next one when more
        // entries remain than fit.
        let (take, chained) = if pages_left > room {
            (room, true)
        } else {
            (pages_left, false)
        };
        let entries = &mut buf[..take];
        read_list(list, entries).map_err(|cause| PrpError::List { at: list, cause })?;
        let data = if chained { take - 1 } else { take };
        for &e in &entries[..data] {
            left = data_page(e, left, out)?;
        }
        if !chained {
            return Ok(());
        }
        // A list that starts in a page's last slot holds only the pointer
        // to the next list page: legal, and every later list page is page
        // aligned, so each of them carries data.
        let next = entries[take - 1];
        if next % page != 0 {
            return Err(PrpError::Offset { entry: next });
        }
        list = next;
    }
}

/// How many list entries a transfer of `len` bytes starting at `prp1`
/// needs (0 when PRP1 and PRP2 suffice): what a driver allocates.
pub fn list_entries(prp1: u64, len: u64, page: u64) -> u64 {
    let first = len.min(page - prp1 % page);
    let rest = (len - first).div_ceil(page);
    if rest <= 1 {
        0
    } else {
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const P: u64 = 4096;

    /// A driver's memory: list pages by address.
    fn reader(mem: &HashMap<u64, u64>) -> impl FnMut(u64, &mut [u64]) -> Result<(), u64> + '_ {
        move |at, out| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = *mem.get(&(at + 8 * i as u64)).ok_or(at)?;
            }
            Ok(())
        }
    }

    #[test]
    fn one_two_and_list() {
        let mem = HashMap::new();
        let mut out = Vec::new();
        walk(0x1010, 0, 100, P, reader(&mem), &mut out).unwrap();
        assert_eq!(out, vec![(0x1010, 100)]);
        walk(0x1800, 0x9000, 4096, P, reader(&mem), &mut out).unwrap();
        assert_eq!(out, vec![(0x1800, 0x800), (0x9000, 0x800)]);
        assert_eq!(
            walk(0x1800, 0x9010, 4096, P, reader(&mem), &mut out),
            Err(PrpError::Offset { entry: 0x9010 })
        );
        assert_eq!(
            walk(0x1002, 0, 8, P, reader(&mem), &mut out),
            Err(PrpError::Offset { entry: 0x1002 })
        );
        // Three pages through a list at 0x20000; adjacent pages merge.
        let mut mem = HashMap::new();
        mem.insert(0x20000, 0x5000);
        mem.insert(0x20008, 0x6000);
        walk(0x4000, 0x20000, 3 * P, P, reader(&mem), &mut out).unwrap();
        assert_eq!(out, vec![(0x4000, 3 * P)]);
        // An unreadable list.
        assert!(matches!(
            walk(0x4000, 0x30000, 3 * P, P, reader(&mem), &mut out),
            Err(PrpError::List { at: 0x30000, .. })
        ));
        // A list starting in its page's last slot: that slot only chains.
        mem.insert(0x40ff8, 0x50000);
        mem.insert(0x50000, 0x7000);
        mem.insert(0x50008, 0x8000);
        walk(0x4000, 0x40ff8, 3 * P, P, reader(&mem), &mut out).unwrap();
        assert_eq!(out, vec![(0x4000, P), (0x7000, 2 * P)]);
        assert_eq!(list_entries(0x4000, 3 * P, P), 2);
        assert_eq!(list_entries(0x4000, 2 * P, P), 0);
    }

    proptest! {
        /// Against a model: random data pages, a list built the way a
        /// driver builds it (chained when it leaves a list page), walked
        /// back to the same pages.
        #[test]
        fn list_walk_matches_model(
            off in (0u64..1024).prop_map(|x| x * 4),
            pages in proptest::collection::vec(1u64..1 << 20, 1..1200),
            list_off in (0u64..512).prop_map(|x| x * 8),
            tail in 1u64..=P,
        ) {
            let k = pages.len() as u64;
            let len = if k == 1 { tail.min(P - off) } else { (P - off) + (k - 2) * P + tail };
            let mut want = vec![(0x7000_0000 + off, len.min(P - off))];
            for (i, p) in pages.iter().enumerate().skip(1) {
                want.push((p * P, if i == pages.len() - 1 { tail } else { P }));
            }
            // Pages after the first (PRP1) go to PRP2 or the list.
            let data: Vec<u64> = pages.iter().skip(1).map(|p| p * P).collect();
            let mut mem = HashMap::new();
            let mut prp2 = 0;
            if data.len() == 1 {
                prp2 = data[0];
            } else if data.len() > 1 {
                let mut at = 0x1_0000_0000u64 + list_off;
                prp2 = at;
                let mut next_list = 0x2_0000_0000u64;
                let mut i = 0;
                while i < data.len() {
                    let room = ((P - at % P) / 8) as usize;
                    if data.len() - i > room {
                        for k in 0..room - 1 {
                            mem.insert(at + 8 * k as u64, data[i + k]);
                        }
                        mem.insert(at + 8 * (room as u64 - 1), next_list);
                        i += room - 1;
                        at = next_list;
                        next_list += P;
                    } else {
                        for k in 0..data.len() - i {
                            mem.insert(at + 8 * k as u64, data[i + k]);
                        }
                        i = data.len();
                    }
                }
            }
            let mut out = Vec::new();
            walk(0x7000_0000 + off, prp2, len, P, reader(&mem), &mut out).unwrap();
            let total: u64 = out.iter().map(|s| s.1).sum();
            prop_assert_eq!(total, len);
            let mut merged = Vec::new();
            for (a, l) in want {
                push(&mut merged, a, l);
            }
            prop_assert_eq!(out, merged);
        }
    }
}
