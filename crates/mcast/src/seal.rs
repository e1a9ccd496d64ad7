//! Authenticated encryption of a session's datagrams (ChaCha20-Poly1305, via ring).
//!
//! Sender and receivers share a key file. Each session gets its own key,
//! `BLAKE3-derive_key("longhaul mcast v1 session key", material || session id)`,
//! so the same file serves any number of sessions. Every datagram carries a fresh
//! random 96-bit nonce from a ChaCha-based CSPRNG seeded by the OS: with random
//! nonces one key is good for 2^32 datagrams (about 6 TB of 1400-byte symbols),
//! and sender and receivers need no coordination to never reuse one.

use rand::{RngCore, SeedableRng};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use std::cell::RefCell;

/// Bytes of the random nonce that opens a sealed body.
pub const NONCE_LEN: usize = 12;
/// Bytes of the Poly1305 tag that closes a sealed body.
pub const TAG_LEN: usize = 16;
/// Shortest key file accepted.
pub const MIN_MATERIAL: usize = 16;

/// One session's ChaCha20-Poly1305 key, derived from the key file and the session id
/// ([`Key::from_material`]).
pub struct Key {
    key: LessSafeKey,
}

thread_local! {
    static RNG: RefCell<rand::rngs::StdRng> = RefCell::new(rand::rngs::StdRng::from_entropy());
}

impl Key {
    /// The key of `session` from a key file's bytes.
    pub fn from_material(material: &[u8], session: u64) -> Result<Key, String> {
        if material.len() < MIN_MATERIAL {
            return Err(format!(
                "a key file must hold at least {MIN_MATERIAL} bytes (it has {}); \
                 make one with: head -c 32 /dev/urandom > mcast.key",
                material.len()
            ));
        }
        let mut h = blake3::Hasher::new_derive_key("longhaul mcast v1 session key");
        h.update(material);
        h.update(&session.to_be_bytes());
        let bytes = h.finalize();
        let key = UnboundKey::new(&CHACHA20_POLY1305, bytes.as_bytes()).expect("32-byte key");
        Ok(Key {
            key: LessSafeKey::new(key),
        })
    }

    /// Fill `out` with random bytes from this thread's CSPRNG: a fresh nonce per datagram.
    pub fn fill_nonce(&self, out: &mut [u8]) {
        RNG.with(|r| r.borrow_mut().fill_bytes(out));
    }

    /// Encrypt `buf[from..]` in place and append the tag.
    pub fn seal_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut Vec<u8>,
        from: usize,
    ) {
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(aad),
                &mut buf[from..],
            )
            .expect("seal");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Decrypt `ct` (ciphertext and tag) in place; the plaintext, or None if forged.
    pub fn open_in_place<'a>(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        ct: &'a mut [u8],
    ) -> Option<&'a [u8]> {
        self.key
            .open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), ct)
            .ok()
            .map(|p| &*p)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

const _: () = assert!(aead::MAX_TAG_LEN == TAG_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_material_is_refused() {
        let e = Key::from_material(b"short", 1).unwrap_err();
        assert!(e.contains("at least 16 bytes"), "{e}");
    }
}
