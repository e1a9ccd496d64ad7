//! Packet buffers: slots of a few size classes, in chunks that are allocated
//! as the pool grows (up to a byte budget) and never freed, so the steady state
//! allocates nothing per packet. A slot may be shared: a TSO aggregate cut in
//! several trains, or a multicast packet queued for several hosts, is one slot
//! with one reference per holder.

/// A slot: its class in the top bits, its index in the class below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufId(pub u32);

const CLASS_SHIFT: u32 = 28;
const INDEX_MASK: u32 = (1 << CLASS_SHIFT) - 1;
/// Bytes per chunk a class grows by (at least one slot).
const CHUNK_BYTES: usize = 2 << 20;

struct Class {
    slot: usize,
    per_chunk: u32,
    chunks: Vec<Box<[u8]>>,
    free: Vec<u32>,
    refs: Vec<u16>,
    allocated: u32,
}

pub(crate) struct Pool {
    classes: Vec<Class>,
    budget: usize,
    used: usize,
}

impl Pool {
    /// A pool with slots of each of `sizes` (ascending), growing to at most
    /// `budget` bytes in all.
    pub(crate) fn new(sizes: &[usize], budget: usize) -> Self {
        assert!(!sizes.is_empty() && sizes.len() <= 8);
        assert!(sizes.windows(2).all(|w| w[0] < w[1]), "sizes ascend");
        let classes = sizes
            .iter()
            .map(|&slot| Class {
                slot,
                per_chunk: (CHUNK_BYTES / slot).max(1) as u32,
                chunks: Vec::new(),
                free: Vec::new(),
                refs: Vec::new(),
                allocated: 0,
            })
            .collect();
        Pool {
            classes,
            budget,
            used: 0,
        }
    }

    /// A free slot of at least `len` bytes (the smallest class that fits and
    /// has room), with one reference; `None` when the budget is spent.
    pub(crate) fn get(&mut self, len: usize) -> Option<BufId> {
        let first = self.classes.iter().position(|c| c.slot >= len)?;
        (first..self.classes.len()).find_map(|k| self.get_in(k))
    }

    fn get_in(&mut self, k: usize) -> Option<BufId> {
        let c = &mut self.classes[k];
        let i = match c.free.pop() {
            Some(i) => i,
            None => {
                let bytes = c.slot * c.per_chunk as usize;
                if self.used + bytes > self.budget || c.allocated + c.per_chunk > INDEX_MASK {
                    return None;
                }
                self.used += bytes;
                c.chunks.push(vec![0u8; bytes].into_boxed_slice());
                let base = c.allocated;
                c.allocated += c.per_chunk;
                c.refs.resize(c.allocated as usize, 0);
                // Hand out the lowest index first.
                c.free.extend((base + 1..c.allocated).rev());
                base
            }
        };
        c.refs[i as usize] = 1;
        Some(BufId(((k as u32) << CLASS_SHIFT) | i))
    }

    /// Turns the caller's one reference to `id` into `n` references (0 frees it).
    pub(crate) fn hand_over(&mut self, id: BufId, n: u32) {
        let (c, i) = self.split(id);
        let class = &mut self.classes[c];
        let r = &mut class.refs[i];
        debug_assert!(*r > 0, "slot {id:?} is free");
        let left = (*r as u32 - 1) + n;
        *r = u16::try_from(left).expect("fewer than 65536 holders of one slot");
        if left == 0 {
            class.free.push(i as u32);
        }
    }

    /// Drops one reference; the slot is free when none is left.
    pub(crate) fn put(&mut self, id: BufId) {
        self.hand_over(id, 0)
    }

    /// Moves the first `len` bytes of `id` into a slot of the smallest class
    /// that holds them, if that is smaller and has room, freeing `id`.
    /// Returns where the bytes are now.
    pub(crate) fn compact(&mut self, id: BufId, len: usize) -> BufId {
        let (c, _) = self.split(id);
        let Some(k) = self.classes.iter().position(|cl| cl.slot >= len) else {
            return id;
        };
        if k >= c {
            return id;
        }
        let Some(to) = self.get_in(k) else {
            return id;
        };
        let (src, dst) = (self.locate(id), self.locate(to));
        let (head, tail) = self.classes.split_at_mut(c);
        head[k].chunks[dst.1][dst.2..dst.2 + len]
            .copy_from_slice(&tail[0].chunks[src.1][src.2..src.2 + len]);
        self.put(id);
        to
    }

    pub(crate) fn buf(&self, id: BufId) -> &[u8] {
        let (c, k, o) = self.locate(id);
        &self.classes[c].chunks[k][o..o + self.classes[c].slot]
    }

    pub(crate) fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        let (c, k, o) = self.locate(id);
        let slot = self.classes[c].slot;
        &mut self.classes[c].chunks[k][o..o + slot]
    }

    /// Slots handed out and not returned.
    pub(crate) fn in_use(&self) -> u32 {
        self.classes
            .iter()
            .map(|c| c.allocated - c.free.len() as u32)
            .sum()
    }

    /// Bytes of slots allocated so far.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.used
    }

    fn split(&self, id: BufId) -> (usize, usize) {
        ((id.0 >> CLASS_SHIFT) as usize, (id.0 & INDEX_MASK) as usize)
    }

    /// (class, chunk, offset in chunk).
    fn locate(&self, id: BufId) -> (usize, usize, usize) {
        let (c, i) = self.split(id);
        let class = &self.classes[c];
        let per = class.per_chunk as usize;
        (c, i / per, (i % per) * class.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_reused_and_capped() {
        // 2 MiB budget of 64-byte slots: one chunk of 32768 slots.
        let mut p = Pool::new(&[64], 2 << 20);
        let ids: Vec<BufId> = std::iter::from_fn(|| p.get(64)).collect();
        assert_eq!(ids.len(), 32768);
        assert_eq!(p.get(1), None);
        for (n, id) in ids.iter().enumerate() {
            p.buf_mut(*id)[..8].copy_from_slice(&(n as u64).to_le_bytes());
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(p.buf(*id)[..8], (n as u64).to_le_bytes());
        }
        assert_eq!(p.in_use(), 32768);
        p.put(ids[7]);
        assert_eq!(p.get(10), Some(ids[7]));
        assert_eq!(p.get(65), None, "no class holds 65 bytes");
    }

    #[test]
    fn shared_slots_are_freed_by_their_last_holder() {
        let mut p = Pool::new(&[64], 2 << 20);
        let a = p.get(10).unwrap();
        p.hand_over(a, 3);
        p.put(a);
        p.put(a);
        assert_eq!(p.in_use(), 1);
        p.put(a);
        assert_eq!(p.in_use(), 0);
        let b = p.get(10).unwrap();
        assert_eq!(a, b);
        p.hand_over(b, 0);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn classes_fit_and_compact_moves_bytes_down() {
        let mut p = Pool::new(&[2048, 65_546], 64 << 20);
        let big = p.get(65_546).unwrap();
        assert_eq!(p.buf(big).len(), 65_546);
        p.buf_mut(big)[..5].copy_from_slice(b"hello");
        let small = p.compact(big, 5);
        assert_ne!(small, big);
        assert_eq!(&p.buf(small)[..5], b"hello");
        assert_eq!(p.buf(small).len(), 2048);
        assert_eq!(p.in_use(), 1);
        // The big slot went back and is handed out again; a large packet stays.
        let big2 = p.get(3000).unwrap();
        assert_eq!(big2, big);
        assert_eq!(p.compact(big2, 3000), big2);
        // The budget counts whole chunks: 2 slots of 1 MiB, then nothing.
        let mut q = Pool::new(&[1 << 20, 2 << 20], 3 << 20);
        for _ in 0..2 {
            let id = q.get(10).unwrap();
            assert_eq!(q.buf(id).len(), 1 << 20);
        }
        assert_eq!(q.allocated_bytes(), 2 << 20);
        assert_eq!(q.get(10), None, "budget spent");
    }
}
