//! Packet buffers: fixed-size slots in chunks that are allocated as the pool
//! grows and never freed, so the steady state allocates nothing per packet.

/// Index of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufId(pub u32);

pub struct Pool {
    slot: usize,
    chunks: Vec<Box<[u8]>>,
    free: Vec<u32>,
    max_slots: u32,
    allocated: u32,
}

const CHUNK_SLOTS: u32 = 1024;

impl Pool {
    /// A pool of slots of `slot` bytes, growing to at most `max_slots`.
    pub fn new(slot: usize, max_slots: u32) -> Self {
        Pool {
            slot,
            chunks: Vec::new(),
            free: Vec::with_capacity(max_slots as usize),
            max_slots,
            allocated: 0,
        }
    }

    pub fn slot_size(&self) -> usize {
        self.slot
    }

    /// A free slot, or `None` when the pool is at its cap.
    pub fn get(&mut self) -> Option<BufId> {
        if let Some(i) = self.free.pop() {
            return Some(BufId(i));
        }
        if self.allocated >= self.max_slots {
            return None;
        }
        let n = CHUNK_SLOTS.min(self.max_slots - self.allocated);
        self.chunks
            .push(vec![0u8; self.slot * CHUNK_SLOTS as usize].into_boxed_slice());
        let base = self.allocated;
        self.allocated += n;
        // Hand out the lowest index first.
        self.free.extend((base + 1..base + n).rev());
        Some(BufId(base))
    }

    pub fn put(&mut self, id: BufId) {
        debug_assert!(id.0 < self.allocated && !self.free.contains(&id.0));
        self.free.push(id.0);
    }

    pub fn buf(&self, id: BufId) -> &[u8] {
        let (c, o) = self.locate(id);
        &self.chunks[c][o..o + self.slot]
    }

    pub fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        let (c, o) = self.locate(id);
        &mut self.chunks[c][o..o + self.slot]
    }

    /// Copies the first `len` bytes of `src` into `dst`.
    pub fn copy(&mut self, src: BufId, dst: BufId, len: usize) {
        let (cs, os) = self.locate(src);
        let (cd, od) = self.locate(dst);
        if cs == cd {
            self.chunks[cs].copy_within(os..os + len, od);
        } else {
            let (lo, hi) = self.chunks.split_at_mut(cs.max(cd));
            let (a, b) = (&mut lo[cs.min(cd)], &mut hi[0]);
            let (from, to) = if cs < cd { (a, b) } else { (b, a) };
            to[od..od + len].copy_from_slice(&from[os..os + len]);
        }
    }

    /// Slots handed out and not returned.
    pub fn in_use(&self) -> u32 {
        self.allocated - self.free.len() as u32
    }

    fn locate(&self, id: BufId) -> (usize, usize) {
        (
            (id.0 / CHUNK_SLOTS) as usize,
            (id.0 % CHUNK_SLOTS) as usize * self.slot,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_reused_and_capped() {
        let mut p = Pool::new(64, 1500);
        let ids: Vec<BufId> = (0..1500).map(|_| p.get().unwrap()).collect();
        assert_eq!(p.get(), None);
        for (n, id) in ids.iter().enumerate() {
            p.buf_mut(*id)[..8].copy_from_slice(&(n as u64).to_le_bytes());
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(p.buf(*id)[..8], (n as u64).to_le_bytes());
        }
        assert_eq!(p.in_use(), 1500);
        p.put(ids[7]);
        assert_eq!(p.get(), Some(ids[7]));
        // Copies within a chunk and across chunks, both ways.
        for (a, b) in [(1, 2), (3, 1400), (1401, 5)] {
            p.copy(ids[a], ids[b], 8);
            assert_eq!(p.buf(ids[b])[..8], (a as u64).to_le_bytes());
        }
    }
}
